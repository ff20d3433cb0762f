//! The dispatcher's side of the model gateway (issue 31, docs/models.md):
//! an endpoint opened for each run whose policy grants models, announced in
//! its environment with the agent's own token in place of any key; each
//! call checked before it is sent (the run still going, the model granted,
//! the budget not spent) and, once answered, recorded as brood counted it
//! (`agent.model.call`) and added to the run's spend, which the child's own
//! `usage` reports can raise but never lower. The endpoint is closed when
//! the run exits or a stop covers it: nothing of it is forwarded after.
//!
//! Rate limits (docs/models.md "Rate limits"): a call past its agent's
//! `model_rate` or its tenant's `quotas.models` in the current one-minute
//! window (`brood_core::rate`) is refused 429 before it is sent. The
//! agent's window lives in its live entry and goes with it when the run
//! ends; the tenant's is one window on the dispatcher (a supervisor serves
//! one tenant), counting the calls this node forwards.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use brood_core::policy::{ModelRate, Network, Policy};
use brood_core::rate::{Over, Scope, Window};
use brood_core::{AgentEvent, AgentName, ModelCall, RunId};
use brood_store::NewEvent;
use tokio::sync::oneshot;

use super::agents::Agents;
use super::{Cmd, Live, Supervisor, ev};
use crate::agent_socket::Listener;
use crate::models::Providers;

/// Opens one run's endpoint: called by the dispatcher at the run's launch
/// (so it must not block) with the supervisor, the agent, its run, the
/// providers and, for an agent in a network namespace of its own, a
/// listener bound on its loopback there (none: the host's loopback).
pub type GatewayHost = Arc<
    dyn Fn(
            Supervisor,
            AgentName,
            RunId,
            Arc<Providers>,
            Option<std::net::TcpListener>,
        ) -> Result<Endpoint, String>
        + Send
        + Sync,
>;

/// The gateway: what opens endpoints (brood-server's `gateway`) and the
/// providers it forwards to (their keys, for what must never reach a child).
#[derive(Clone)]
pub struct Gateway {
    pub host: GatewayHost,
    pub providers: Arc<Providers>,
}

/// One run's endpoint, open.
pub struct Endpoint {
    /// `http://127.0.0.1:PORT`, the origin before `/v1/...`.
    pub origin: String,
    pub port: u16,
    /// The run's capability: what its clients send as their key.
    pub token: String,
    /// Closed when the run ends: its connections are cut.
    pub listener: Listener,
}

/// Why a call is not sent: the HTTP status and code the agent is answered with.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRefusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// For a 429: the rate limit reached (its `retry_after_s` is the
    /// answer's `Retry-After`).
    pub rate: Option<Over>,
}

/// Milliseconds on a clock that does not go back, from the first time it
/// was read: what the rate windows count in.
fn mono_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The model gateway's part of the supervisor: the tenant's rate window
/// (`quotas.models`, issue 31), one per supervisor, which serves one
/// tenant. Per node: it counts the calls this node forwards
/// (docs/decisions/models.md "Rate limits: per node"). Its calls are lent
/// the live set (each run's policy, window and spend) and return what the
/// loop must write (`route::models`).
#[derive(Debug, Default)]
pub(super) struct Models {
    window: Window,
}

/// A call metered ([`Models::used`]): its event for the agent's log, and
/// the run whose spend it changed, to be settled.
pub(super) struct Metered {
    pub(super) event: NewEvent,
    pub(super) settle: Option<(AgentName, RunId)>,
}

/// A run's spend settled ([`usage`]): what its run's record says now, and
/// the growth to roll up the tree.
pub(super) struct Usage {
    pub(super) tokens_in: u64,
    pub(super) tokens_out: u64,
    pub(super) cost: f64,
    pub(super) delta: f64,
}

/// What the gateway asks of the dispatcher.
pub(crate) enum ModelOp {
    /// May this call be sent? The budget left (`None`: no limit) if so.
    Check {
        model: String,
        estimate_usd: f64,
        reply: oneshot::Sender<Result<Option<f64>, ModelRefusal>>,
    },
    /// A call ended (or was refused at the gateway): record and count it.
    Used(Box<ModelCall>),
}

impl Supervisor {
    /// Asks whether `name`'s run `run` may send a call for `model`, whose
    /// input alone is estimated at `estimate_usd`.
    pub async fn model_check(
        &self,
        name: AgentName,
        run: RunId,
        model: String,
        estimate_usd: f64,
    ) -> Result<Option<f64>, ModelRefusal> {
        let stopped = || ModelRefusal {
            status: 503,
            code: "unavailable",
            message: "the supervisor has stopped".into(),
            rate: None,
        };
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Model(
                name,
                run,
                ModelOp::Check {
                    model,
                    estimate_usd,
                    reply: tx,
                },
            ))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Records a call as brood metered it.
    pub fn model_used(&self, call: ModelCall) {
        let (name, run) = (call.agent.clone(), call.run.clone());
        let _ = self
            .tx
            .send(Cmd::Model(name, run, ModelOp::Used(Box::new(call))));
    }
}

/// Whether a policy grants any model: every model when it names none, none
/// when its list is empty.
pub(super) fn grants_models(p: &Policy) -> bool {
    p.models.as_ref().is_none_or(|m| !m.is_empty())
}

impl Models {
    /// May `name`'s run `run` send a call for `model`, its input alone
    /// estimated at `estimate_usd`? The budget left (`None`: no limit) if
    /// so; counted against the rate windows when it may.
    pub(super) fn check(
        &mut self,
        agents: &mut Agents,
        tenant_limits: &ModelRate,
        name: &AgentName,
        run: &RunId,
        model: &str,
        estimate_usd: f64,
    ) -> Result<Option<f64>, ModelRefusal> {
        let ended = || ModelRefusal {
            status: 403,
            code: "agent_ended",
            message: format!("agent {name}'s run {run} is not running: nothing of it is forwarded"),
            rate: None,
        };
        let l = agents.live.get(name).ok_or_else(ended)?;
        if &l.run != run || l.stopping.is_some() || l.exit.is_some() {
            return Err(ended());
        }
        if let Some(granted) = &l.policy.models
            && !granted.contains(model)
        {
            let list: Vec<&str> = granted.iter().map(String::as_str).collect();
            return Err(ModelRefusal {
                status: 403,
                code: "model_not_granted",
                message: format!(
                    "model {model:?} is not granted to agent {name} (its policy's models: {})",
                    if list.is_empty() {
                        "none".to_owned()
                    } else {
                        list.join(", ")
                    }
                ),
                rate: None,
            });
        }
        let left = budget_left(agents, name);
        if let Some((left, holder)) = &left
            && (*left <= 0.0 || estimate_usd > *left)
        {
            return Err(ModelRefusal {
                status: 402,
                code: "budget_exceeded",
                message: format!(
                    "the call would pass the budget: its input alone is estimated at \
                     ${estimate_usd:.6}, and {holder}'s cost_limit leaves ${:.6}",
                    left.max(0.0)
                ),
                rate: None,
            });
        }
        self.rate_admit(agents, tenant_limits, name)?;
        Ok(left.map(|(l, _)| l))
    }

    /// The call counted against its agent's and its tenant's rate windows,
    /// or refused 429 when either has reached a limit (the agent's first:
    /// it is the one the agent's policy can be asked about). Counted only
    /// when both let it through, so a refused call uses nothing.
    fn rate_admit(
        &mut self,
        agents: &mut Agents,
        tenant_limits: &ModelRate,
        name: &AgentName,
    ) -> Result<(), ModelRefusal> {
        let now = mono_ms();
        let Some(l) = agents.live.get_mut(name) else {
            return Ok(());
        };
        let refused = |o: Over| ModelRefusal {
            status: 429,
            code: "rate_limit_exceeded",
            message: format!("agent {name}: {o}"),
            rate: Some(o),
        };
        l.model_window
            .check(now, &l.policy.model_rate, Scope::Agent)
            .map_err(refused)?;
        self.window
            .check(now, tenant_limits, Scope::Tenant)
            .map_err(refused)?;
        l.model_window.count_request(now);
        self.window.count_request(now);
        Ok(())
    }

    /// A call as brood metered it: counted in the windows and added to its
    /// run's metered spend; its event for the agent's log, and the run to
    /// settle when the call was of its current run. Nothing for an agent no
    /// longer here (said in the log).
    pub(super) fn used(
        &mut self,
        agents: &mut Agents,
        tracer: &crate::trace::Tracer,
        call: ModelCall,
    ) -> Option<Metered> {
        let name = call.agent.clone();
        // Tokens a minute count what brood metered, once it is known: the
        // tenant's whatever became of the agent since the call was sent.
        let tokens = call.tokens_in.saturating_add(call.tokens_out);
        let now = mono_ms();
        self.window.count_tokens(now, tokens);
        let Some(l) = agents.live.get_mut(&name) else {
            tracing::info!(agent = %name, model = %call.model, "a model call of an agent no longer here");
            return None;
        };
        let session = l.session.clone();
        let counts = l.run == call.run;
        if counts && call.cost_usd.is_finite() && call.cost_usd > 0.0 {
            l.metered_usd += call.cost_usd;
        }
        if counts {
            l.metered_in += call.tokens_in;
            l.metered_out += call.tokens_out;
            l.model_window.count_tokens(now, tokens);
        }
        let run = call.run.clone();
        if tracer.on()
            && let Some(s) = crate::trace::model_call_span(l.trace, &call)
        {
            tracer.emit(s);
        }
        let event = ev(&name, Some(&run), &session, AgentEvent::ModelCall(call));
        Some(Metered {
            event,
            settle: counts.then_some((name, run)),
        })
    }
}

/// The least any budget above `name` (its own included) has left, and
/// whose budget that is.
fn budget_left(agents: &Agents, name: &AgentName) -> Option<(f64, AgentName)> {
    let mut least: Option<(f64, AgentName)> = None;
    let mut cur = Some(name.clone());
    let mut hops = 0;
    while let Some(n) = cur {
        let Some(l) = agents.live.get(&n) else {
            break;
        };
        if let Some(limit) = l.policy.cost_limit {
            let left = limit - l.subtree_usd;
            if least.as_ref().is_none_or(|(x, _)| left < *x) {
                least = Some((left, n.clone()));
            }
        }
        cur = l.parent.clone();
        hops += 1;
        if hops > 10_000 {
            break;
        }
    }
    least
}

/// The run's spend: the more of what it reported and what brood metered,
/// kept in its live entry; what its record must say and the growth to
/// roll up the tree (SPEC 9).
pub(super) fn usage(l: &mut Live) -> Usage {
    let cost = l.reported_usd.max(l.metered_usd).max(l.run_usd);
    let delta = cost - l.run_usd;
    l.run_usd = cost;
    Usage {
        tokens_in: l.reported_in.max(l.metered_in),
        tokens_out: l.reported_out.max(l.metered_out),
        cost,
        delta,
    }
}

/// Opens the run's endpoint when its policy grants models and the operator
/// configured a provider (`gw`): the variables its clients read (each key
/// variable set to the run's token) and the port its sandbox must let it
/// reach; the endpoint kept in its live entry `l`, closed with it. Nothing
/// when it cannot be opened (said in the log): the agent runs without a
/// gateway. `netns` is the empty network namespace the agent will run in,
/// if one was made for it ahead (the pool's): its endpoint is bound on the
/// loopback there, the one address it has.
pub(super) fn open_gateway(
    gw: &Gateway,
    sup: Supervisor,
    l: &mut Live,
    name: &AgentName,
    run: &RunId,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Option<(Vec<(String, String)>, u16)> {
    if !grants_models(&l.policy) {
        return None;
    }
    let inside = if l.iso_ns && matches!(l.policy.network, Network::None) {
        // Its own empty namespace has no way to the host's loopback.
        // One it would make itself (the pool had none ready) is not
        // there yet to bind in: it then runs without an endpoint.
        let Some(ns) = netns else {
            tracing::warn!(agent = %name, "no network namespace ready to open the model gateway in");
            return None;
        };
        match brood_launch::ns::bind_loopback_in(ns) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "binding the model gateway in the agent's network namespace failed");
                return None;
            }
        }
    } else if matches!(l.policy.network, Network::None) {
        // In the host's network namespace a `network: none` agent may
        // make no socket, and a TCP socket let through for its endpoint
        // could reach that port on any host (landlock checks ports, not
        // addresses): `network: none` would no longer mean none. Such an
        // agent reaches models with `iso = ns`, where its endpoint is
        // the one thing on its loopback (docs/models.md).
        tracing::info!(agent = %name, "network none in the host's namespace: no model gateway (iso = ns gives it one)");
        return None;
    } else {
        None
    };
    let ep = match (gw.host)(sup, name.clone(), run.clone(), gw.providers.clone(), inside) {
        Ok(ep) => ep,
        Err(e) => {
            tracing::warn!(agent = %name, error = %e, "opening the model gateway failed");
            return None;
        }
    };
    let mut env = Vec::new();
    if gw.providers.openai.is_some() {
        env.push(("OPENAI_BASE_URL".to_owned(), format!("{}/v1", ep.origin)));
        env.push(("OPENAI_API_BASE".to_owned(), format!("{}/v1", ep.origin)));
        env.push(("OPENAI_API_KEY".to_owned(), ep.token.clone()));
    }
    if gw.providers.anthropic.is_some() {
        env.push(("ANTHROPIC_BASE_URL".to_owned(), ep.origin.clone()));
        env.push(("ANTHROPIC_API_KEY".to_owned(), ep.token.clone()));
    }
    let port = ep.port;
    l.gateway = Some(ep.listener);
    Some((env, port))
}

/// Drops from an agent's environment any value holding a provider's key,
/// whoever wrote it there (a policy's `env`, a secret): no key enters a
/// child.
pub(super) fn strip_keys(providers: &Providers, name: &AgentName, env: &mut Vec<(String, String)>) {
    env.retain(|(k, v)| {
        let holds = providers.key_values().any(|key| v.contains(key));
        if holds {
            tracing::warn!(agent = %name, variable = %k, "a provider's key kept out of an agent's environment");
        }
        !holds
    });
}
