//! What every surface's requests share (SPEC 11): who calls, what a creation
//! asks for, and the errors, as the supervisor sees them, independent of the
//! wire that carried them. The verbs themselves are the supervisor's
//! ([`crate::supervisor::handle`]); this module sits below it, so every
//! layer can name a caller or an error without reaching up.

use brood_core::{AgentName, Code, Iso, Life, Protocol, SessionName};
use brood_store::StoreError;
use serde_json::{Value, json};

/// A refused or failed request: a SPEC code and a message for the requester.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    /// When a rate refused the request: the seconds after which asking again
    /// may succeed (HTTP's `Retry-After`).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// The same refusal, saying when to ask again.
    pub fn retry_after(mut self, secs: u64) -> ApiError {
        self.retry_after_s = Some(secs);
        self
    }
    pub fn to_json(&self) -> Value {
        let mut v = json!({"code": self.code.as_str(), "reason": self.code.as_str(), "message": self.message});
        if let Some(secs) = self.retry_after_s {
            v["retry_after_s"] = secs.into();
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// Every surface answers a store error the same way ([`internal`]): a store
/// that is away is 503 with when to ask again, never a 500 (issue 28).
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        internal(e)
    }
}

/// Who is asking. Decided by the supervisor from peer credentials and the
/// caller's cgroup, never from what the caller claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A person or program outside every tree (the operator).
    User { uid: u32 },
    /// A process inside an agent's cgroup.
    Agent(AgentName),
}

/// A creation request.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    pub name: Option<AgentName>,
    /// The parent; for an agent caller it must be the caller itself (the default).
    pub parent: Option<AgentName>,
    pub argv: Vec<String>,
    pub protocol: Protocol,
    pub task: String,
    pub env: Vec<(String, String)>,
    /// Secret values the caller gives a root (issue 25): each name joins
    /// the policy's `secrets`; the values live in the supervisor's memory
    /// only. A child's come from its parent, so a request with a parent
    /// that gives any is refused.
    pub secrets: brood_api::Secrets,
    pub cwd: Option<String>,
    pub session: SessionName,
    /// Reply only once the agent said `ready` (or ended), not as soon as it started.
    pub await_ready: bool,
    /// The requested policy (SPEC 5 fields, any subset; the rest is inherited), as
    /// JSON. Read and checked against the parent's effective policy at admission.
    pub policy: Option<Value>,
    /// `owned` (the default) or `temp`; `detached` is refused at admission
    /// (SPEC 3).
    pub life: Life,
    /// `ns`: a private mount namespace built from the policy's mounts (SPEC 3
    /// `iso`); `none` (the default): the host's.
    pub iso: Iso,
    /// With `iso = ns`: the directory that becomes the agent's `/` (SPEC 3 `root`);
    /// brood makes an empty one when none is given.
    pub root: Option<String>,
    /// Who receives the result (SPEC 9 `customer`): the parent when `None`.
    /// Must be an unfinished agent of the tenant; a customer chain that would
    /// loop is refused with `Cycle`.
    pub customer: Option<AgentName>,
    /// Free text for people (SPEC 3 `label`): one line, at most 256 characters.
    pub label: Option<String>,
    /// In a cluster: run on a node with these labels and free capacity
    /// (docs/many-nodes.md); `None`: the parent's node.
    pub placement: Option<std::collections::BTreeMap<String, String>>,
    /// The caller's W3C trace context (the `traceparent` header of the HTTP
    /// API and of `/mcp`, issue 30): a root's runs join the caller's trace,
    /// under its span. `None`: a root starts a trace of its own, a child
    /// joins its parent's.
    pub traceparent: Option<brood_otel::TraceContext>,
}

pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

/// Secret values as a caller gives them (`POST /api/agents`, `resume`):
/// names as a policy's `env` names them, values without NUL. Neither error
/// shows a value.
pub fn check_secrets(secrets: &brood_api::Secrets) -> Result<(), ApiError> {
    for (k, v) in secrets.pairs() {
        brood_core::policy::check_var_name("secrets", k)
            .and_then(|()| brood_core::policy::check_secret_value(&format!("secrets.{k}"), v))
            .map_err(|e| bad(format!("{}: {}", e.field, e.message)))?;
    }
    Ok(())
}

impl SpawnRequest {
    /// Parses the `spawn` arguments of the protocol: `brood_api::SpawnBody`
    /// as JSON, its wrong field named.
    pub fn from_json(args: &Value) -> Result<SpawnRequest, ApiError> {
        let body: brood_api::SpawnBody = brood_api::parse_value(args.clone()).map_err(bad)?;
        SpawnRequest::from_body(body)
    }

    /// A creation request from its wire form, every field checked: names,
    /// the words of `protocol`, `life` and `iso`, the environment, the label.
    /// `protocol` defaults to `brood` here (the CLI picks `exec` for programs
    /// that are not brood's own agents before it asks).
    pub fn from_body(b: brood_api::SpawnBody) -> Result<SpawnRequest, ApiError> {
        let name_of = |key: &str, v: Option<String>| -> Result<Option<AgentName>, ApiError> {
            v.map(|s| {
                AgentName::new(&s)
                    .map_err(|e| ApiError::new(Code::InvalidName, format!("{key}: {e}")))
            })
            .transpose()
        };
        check_argv("argv", &b.argv)?;
        let protocol = match b.protocol.as_deref() {
            None => Protocol::Brood,
            Some(p) => Protocol::parse(p)
                .ok_or_else(|| bad(format!("protocol: must be brood or exec, not {p:?}")))?,
        };
        let mut env = Vec::new();
        for (k, v) in b.env.unwrap_or_default() {
            // The policy's own `env` rules (brood-core): the variables end up
            // in one environment and one control file, a line each.
            if k.is_empty()
                || k.contains('=')
                || k.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(bad(format!(
                    "env.{}: not a variable name (no \"=\", whitespace or control characters)",
                    k.escape_debug()
                )));
            }
            if v.contains('\0') || v.contains('\n') {
                // The value is not echoed: environment values are often secrets.
                return Err(bad(format!(
                    "env.{k}: the value must not contain a NUL byte or a newline"
                )));
            }
            if brood_launch::env::is_reserved(&k) {
                return Err(bad(format!(
                    "env.{k}: BROOD_*, CTX_*, TRACEPARENT and TRACESTATE are set by the runtime"
                )));
            }
            env.push((k, v));
        }
        let secrets = b.secrets.unwrap_or_default();
        check_secrets(&secrets)?;
        let session = match b.session.as_deref() {
            None => SessionName::default_session(),
            Some(s) => SessionName::new(s)
                .map_err(|e| ApiError::new(Code::InvalidName, format!("session: {e}")))?,
        };
        let label = match b.label {
            None => None,
            // Characters, not bytes: as the OpenAPI document's `maxLength` counts.
            Some(l) if l.chars().count() <= 256 && !l.chars().any(char::is_control) => Some(l),
            Some(l) => {
                return Err(bad(format!(
                    "label: must be one line of at most 256 characters without control characters, got {l:?}"
                )));
            }
        };
        let task = b.task.unwrap_or_default();
        if task.contains('\0') {
            return Err(bad("task: must not contain a NUL byte"));
        }
        let cwd = match b.cwd {
            None => None,
            Some(c) => Some(
                brood_core::policy::AbsPath::new("cwd", &c)
                    .map_err(|e| bad(e.to_string()))?
                    .as_str()
                    .to_owned(),
            ),
        };
        if let Some(p) = &b.placement {
            for (k, v) in &p.labels {
                if k.is_empty() || format!("{k}{v}").chars().any(char::is_control) {
                    return Err(bad(format!(
                        "placement.labels.{}: a label needs a name, and neither may hold control characters",
                        k.escape_debug()
                    )));
                }
            }
        }
        Ok(SpawnRequest {
            traceparent: None,
            placement: b.placement.map(|p| p.labels),
            name: name_of("name", b.name)?,
            parent: name_of("parent", b.parent)?,
            customer: name_of("customer", b.customer)?,
            argv: b.argv,
            protocol,
            task,
            env,
            secrets,
            cwd,
            session,
            await_ready: b.await_ready.unwrap_or(false),
            policy: b.policy.filter(|p| !p.is_null()),
            life: match b.life.as_deref() {
                None => Life::Owned,
                Some(l) => Life::parse(l).ok_or_else(|| {
                    bad(format!("life: must be owned, temp or detached, not {l:?}"))
                })?,
            },
            label,
            iso: match b.iso.as_deref() {
                None => Iso::None,
                Some(i) => Iso::parse(i)
                    .ok_or_else(|| bad(format!("iso: must be ns or none, not {i:?}")))?,
            },
            root: match b.root {
                None => None,
                Some(r) => Some(
                    brood_core::policy::AbsPath::new("root", &r)
                        .map_err(|e| bad(e.to_string()))?
                        .as_str()
                        .to_owned(),
                ),
            },
        })
    }
}

/// A program and its arguments as `execve` takes them: a program named,
/// no NUL byte anywhere (C strings end there), and a program path that is
/// absolute or a bare name looked up in the agent's `PATH`: a relative
/// path would be resolved against the supervisor's directory, not the
/// caller's. `field` is `argv` or `worker.argv`.
pub fn check_argv(field: &str, argv: &[String]) -> Result<(), ApiError> {
    let Some(prog) = argv.first() else {
        return Err(bad(format!("{field}: must name a program")));
    };
    if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
        return Err(bad(format!("{field}[{i}]: must not contain a NUL byte")));
    }
    if prog.is_empty() {
        return Err(bad(format!("{field}[0]: the program must not be empty")));
    }
    if !prog.starts_with('/') && prog.contains('/') {
        return Err(bad(format!(
            "{field}[0]: {prog:?} is a relative path; give the program's absolute path \
             (the supervisor does not run in the caller's directory)"
        )));
    }
    Ok(())
}

/// A store error as the caller sees it: a refusal, an unknown name or a
/// state conflict answered with its code; a store that is away answered
/// `Unavailable` with `Retry-After`; anything else logged here and answered
/// `Internal` without the store's detail.
pub(crate) fn internal(e: StoreError) -> ApiError {
    // A refusal, an unknown name or a state conflict is the caller's error,
    // answered with its code: not the supervisor's to log as one of its own.
    match &e {
        StoreError::Refused { .. }
        | StoreError::NotFound { .. }
        | StoreError::Transition { .. } => {
            tracing::debug!(error = %e, "a request the store refused")
        }
        _ => tracing::error!(error = %e, "store error"),
    }
    match e {
        StoreError::Refused { code, message } => ApiError::new(code, message),
        StoreError::NotFound { name, .. } => {
            ApiError::new(Code::NotFound, format!("no agent named {name}"))
        }
        StoreError::Transition { name, source } => {
            ApiError::new(Code::Conflict, format!("agent {name}: {source}"))
        }
        // Away, not wrong: the caller asks again (issue 27 item 5).
        StoreError::PostgresInDoubt { .. } => ApiError::new(
            Code::Unavailable,
            "the store did not answer whether this was recorded; look before asking again \
             (see the supervisor's log)",
        )
        .retry_after(1),
        e if e.is_unavailable() => ApiError::new(
            Code::Unavailable,
            "the store is not answering; nothing was recorded, ask again (see the supervisor's log)",
        )
        .retry_after(1),
        _ => ApiError::new(Code::Internal, "store error (see the supervisor's log)"),
    }
}

pub(crate) fn not_found(name: &AgentName) -> ApiError {
    ApiError::new(Code::NotFound, format!("no agent named {name}"))
}

#[cfg(test)]
mod tests {
    use super::{ApiError, internal};
    use brood_core::Code;
    use brood_store::StoreError;
    use std::time::Duration;

    fn mapped(e: StoreError) -> ApiError {
        internal(e)
    }

    #[test]
    fn a_store_that_is_away_is_unavailable_with_when_to_ask_again() {
        let away = mapped(StoreError::PostgresDeadline {
            target: "db".into(),
            after: Duration::from_secs(20),
        });
        assert_eq!(
            (away.code, away.retry_after_s),
            (Code::Unavailable, Some(1))
        );
        let doubt = mapped(StoreError::PostgresInDoubt {
            target: "db".into(),
            message: "commit unanswered".into(),
        });
        assert_eq!(
            (doubt.code, doubt.retry_after_s),
            (Code::Unavailable, Some(1))
        );
        assert!(
            doubt.message.contains("look before asking again"),
            "{}",
            doubt.message
        );
        // Nothing of the server's address leaks into the answer.
        assert!(!away.message.contains("db"), "{}", away.message);
    }

    #[test]
    fn a_store_that_is_wrong_is_still_internal_and_a_refusal_keeps_its_code() {
        let corrupt = mapped(StoreError::Corrupt {
            what: "status",
            value: "x".into(),
        });
        assert_eq!(
            (corrupt.code, corrupt.retry_after_s),
            (Code::Internal, None)
        );
        let refused = mapped(StoreError::Refused {
            code: Code::QuotaFanout,
            message: "max_fanout".into(),
        });
        assert_eq!(refused.code, Code::QuotaFanout);
    }
}
