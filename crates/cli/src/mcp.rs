//! `brood mcp`: brood's tools (brood-mcp) for an MCP client over stdio, as a
//! client of the daemon's API like every other command. The session works
//! in a subtree of its own: on the first call that needs one it asks the
//! daemon for a session root (`POST /api/mcp/session`, with the operator's
//! `--policy`) and holds that request open for as long as it runs; the
//! daemon cancels the root, and with it everything the session spawned,
//! when the connection closes, however this process ended. Inside an agent
//! the daemon answers with that agent instead, and the session's children
//! are the agent's own. Every tool call carries the capability the daemon
//! gave with the root, so the daemon takes it as that root, confined to its
//! subtree, never as the operator this process is on the socket. And
//! `brood mcp-root`, the program a session root
//! runs: it says `ready` and lives until it is cancelled.
//!
//! stdout is the MCP stream: logs go to stderr (the tracing subscriber's
//! writer), nothing else is printed.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use brood_api::{ErrorBody, SessionStart};
use brood_mcp::{Answer, Backend, Owner, ToolError, Tools};
use brood_server::client::{self, Endpoint};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::{OnceCell, oneshot};

use crate::Exit;

/// The session the daemon gave: who it works for, and the capability that
/// makes every tool call act as that root (none inside an agent, where the
/// daemon knows the caller as that agent already).
#[derive(Clone)]
struct Session {
    owner: Owner,
    capability: Option<String>,
}

/// What `brood mcp` asks for its session root: the operator's policy
/// (`--policy`) and secrets (`--secret`), which its children inherit.
pub(crate) struct Root {
    pub(crate) policy: Option<Value>,
    pub(crate) secrets: brood_api::Secrets,
}

/// The stdio session's way to the daemon.
struct Stdio {
    ep: Endpoint,
    /// The session root's policy and secrets.
    root: Root,
    session: OnceCell<Session>,
    /// The task holding the session's stream open.
    hold: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Stdio {
    /// Asks the daemon for the session's owner and keeps the answer's stream
    /// open in a task of its own.
    async fn open(&self, client: Option<String>) -> Result<Session, ToolError> {
        let (tx, rx) = oneshot::channel::<Result<SessionStart, ToolError>>();
        let tx = Arc::new(Mutex::new(Some(tx)));
        let send = {
            let tx = tx.clone();
            move |r: Result<SessionStart, ToolError>| {
                if let Ok(mut g) = tx.lock()
                    && let Some(tx) = g.take()
                {
                    let _ = tx.send(r);
                }
            }
        };
        let ep = self.ep.clone();
        let mut body = json!({"client": client, "policy": self.root.policy});
        if !self.root.secrets.is_empty() {
            body["secrets"] = serde_json::to_value(&self.root.secrets)
                .map_err(|e| ToolError::new("Internal", e.to_string()))?;
        }
        let task = tokio::spawn(async move {
            let first = send.clone();
            // Whether the daemon made a root this stream holds (inside an
            // agent it answers with the agent and ends the stream at once).
            let holds = Arc::new(AtomicBool::new(false));
            let holding = holds.clone();
            let r = client::stream_request(
                &ep,
                "POST",
                "/api/mcp/session",
                Some(&body),
                None,
                move |ev| {
                    let v = serde_json::from_str::<SessionStart>(&ev.data).map_err(|e| {
                        ToolError::new("Internal", format!("the session's answer: {e}"))
                    });
                    if let Ok(v) = &v {
                        holding.store(v.root, Ordering::SeqCst);
                    }
                    first(v);
                    true
                },
            )
            .await;
            if matches!(r, Ok(None)) && !holds.load(Ordering::SeqCst) {
                return;
            }
            let ended = match r {
                Ok(Some(a)) => match serde_json::from_value::<ErrorBody>(a.body.clone()) {
                    Ok(e) => ToolError::new(&e.error.code, e.error.message),
                    Err(_) => ToolError::new("Internal", format!("HTTP {}: {}", a.status, a.body)),
                },
                Ok(None) => ToolError::new("Unavailable", "the daemon ended this MCP session"),
                Err(e) => ToolError::new("Unavailable", e.0),
            };
            tracing::warn!(code = %ended.code, message = %ended.message, "MCP session stream ended");
            send(Err(ended));
        });
        if let Ok(mut h) = self.hold.lock() {
            *h = Some(task);
        }
        let v = rx.await.map_err(|_| {
            ToolError::new("Internal", "the session's task ended without an answer")
        })??;
        let SessionStart {
            owner: name,
            root,
            capability,
            ..
        } = v;
        if root && capability.is_none() {
            // Without it the tools would act as the operator: refuse them all.
            return Err(ToolError::new(
                "Internal",
                "the daemon made the session's root but gave no capability to act as it; \
                 is it an older brood?",
            ));
        }
        tracing::info!(owner = %name, root, "MCP session opened");
        Ok(Session {
            owner: Owner {
                name,
                as_parent: root,
            },
            capability,
        })
    }

    /// The session, opened on first need; the client's name is the
    /// handshake's `clientInfo`, or (protocols without a handshake) the one
    /// each request carries.
    async fn session(&self, ctx: &RequestContext<RoleServer>) -> Result<Session, ToolError> {
        let client = ctx
            .peer
            .peer_info()
            .map(|i| i.client_info.name.clone())
            .or_else(|| ctx.meta.client_info().map(|i| i.name));
        self.session
            .get_or_try_init(|| self.open(client))
            .await
            .cloned()
    }

    /// The session is over: its root (if it made one) is cancelled now,
    /// rather than when the daemon notices the connection closing.
    async fn end(&self) {
        // As the operator who made the root (no capability): a root is
        // nobody's descendant, so it cannot cancel itself.
        if let Some(s) = self.session.get()
            && s.owner.as_parent
        {
            let path = format!("/api/agents/{}/cancel", s.owner.name);
            if let Err(e) = client::call(&self.ep, "POST", &path, Some(&json!({})), None).await {
                tracing::warn!(error = %e, "cancelling the MCP session's root");
            }
        }
        if let Ok(mut h) = self.hold.lock()
            && let Some(t) = h.take()
        {
            t.abort();
        }
    }
}

impl Backend for Stdio {
    async fn call(
        &self,
        ctx: &RequestContext<RoleServer>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, String> {
        // Every call acts as the session's root, so the session is opened
        // first: a call made before it would act as the operator.
        let session = match self.session(ctx).await {
            Ok(s) => s,
            Err(e) => {
                return Ok(Answer {
                    status: 503,
                    body: json!({"error": {"code": e.code, "reason": e.code, "message": e.message}}),
                });
            }
        };
        let headers: Vec<(&str, &str)> = session
            .capability
            .as_deref()
            .map(|c| (brood_server::MCP_SESSION_HEADER, c))
            .into_iter()
            .collect();
        client::call_with(&self.ep, method, path, body.as_ref(), None, &headers)
            .await
            .map(|a| Answer {
                status: a.status,
                body: a.body,
            })
            .map_err(|e| format!("no brood daemon answers ({e}); start one with `brood serve`"))
    }

    async fn owner(&self, ctx: &RequestContext<RoleServer>) -> Result<Option<Owner>, ToolError> {
        self.session(ctx).await.map(|s| Some(s.owner))
    }
}

/// `brood mcp`: serves the tools on stdin/stdout until the client goes.
pub(crate) async fn serve(
    ep: Endpoint,
    root: Root,
    home: PathBuf,
    agent_args: Vec<String>,
) -> Result<i32> {
    let backend = Arc::new(Stdio {
        ep,
        root,
        session: OnceCell::new(),
        hold: Mutex::new(None),
    });
    let brood = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "brood".into());
    let tools = Tools::new(backend.clone(), brood, Some(home)).with_agent_args(agent_args);
    let running = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Exit(1, format!("the MCP handshake on stdio failed: {e}")))?;
    let why = running.waiting().await;
    tracing::info!(?why, "MCP client gone");
    backend.end().await;
    Ok(0)
}

/// `brood mcp-root`: a session root's program. It speaks brood's protocol
/// only to say `ready` and answer pings, and ends at `cancel` or when its
/// input closes; its children are what the session spawned.
pub(crate) fn root_program() -> i32 {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let reply = match v["type"].as_str() {
            Some("init") => Some(r#"{"type":"ready"}"#),
            Some("ping") => Some(r#"{"type":"pong"}"#),
            Some("cancel") => return 0,
            _ => None,
        };
        if let Some(r) = reply
            && (writeln!(out, "{r}").is_err() || out.flush().is_err())
        {
            return 1;
        }
    }
    0
}
