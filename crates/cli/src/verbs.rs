//! The commands that talk to a supervisor through its API: the verbs
//! (`spawn send wait cancel close resume`) and the reads (`ps tree show
//! events`), which read the store instead when no daemon answers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brood_runtime::agentruntime::{EventFormat, to_agentruntime};
use serde_json::{Value, json};

use crate::remote::{Remote, typed};
use crate::{Exit, api, render, view, wait_code_of};

/// The longest one HTTP wait asks for; longer waits ask again.
const WAIT_STEP_S: f64 = 3600.0;

/// How long `cancel` waits for the stop to finish before saying `stopping`:
/// far past the grace period (3 s by default) and the kill after it.
const CANCEL_WAIT_S: f64 = 60.0;

pub(crate) struct Spawn {
    pub body: Value,
    pub json: bool,
}

pub(crate) async fn spawn(r: &Remote, s: Spawn) -> Result<i32> {
    let v = r.call("POST", "/api/agents", Some(s.body)).await?;
    let a: brood_api::Agent = typed(&v)?;
    if s.json {
        println!("{v}");
    } else {
        println!("{}\t{}\t{}", a.name, render::status(&a), a.run);
    }
    Ok(if a.status == "failed" { 1 } else { 0 })
}

pub(crate) async fn send(r: &Remote, name: &str, text: String) -> Result<i32> {
    let v = r
        .call(
            "POST",
            &format!("/api/agents/{name}/input"),
            Some(json!({"text": text})),
        )
        .await?;
    let sent: brood_api::InputReply = typed(&v)?;
    println!("{}", sent.id);
    Ok(0)
}

/// Waits for each agent in turn, within one deadline (none: until they end).
pub(crate) async fn wait(
    r: &Remote,
    names: &[String],
    timeout: Option<f64>,
    json_out: bool,
) -> Result<i32> {
    if let Some(t) = timeout
        && !(t.is_finite() && t >= 0.0)
    {
        return Err(Exit(
            2,
            format!("--timeout must be a non-negative number of seconds, not {t}"),
        )
        .into());
    }
    let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut agents: Vec<brood_api::Agent> = Vec::new();
    let mut timed_out = false;
    for name in names {
        loop {
            let step = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64()
                    .min(WAIT_STEP_S),
                None => WAIT_STEP_S,
            };
            let v = r
                .call(
                    "POST",
                    &format!("/api/agents/{name}/wait"),
                    Some(json!({"timeout_s": step})),
                )
                .await?;
            let w: brood_api::WaitReply = typed(&v)?;
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if !w.timed_out || expired {
                timed_out |= w.timed_out;
                agents.extend(w.agents);
                break;
            }
        }
    }
    if json_out {
        let all = brood_api::WaitReply { agents, timed_out };
        println!("{}", to_value(&all));
        return Ok(if timed_out {
            2
        } else {
            all.agents
                .iter()
                .map(|a| wait_code_of(&a.state))
                .max()
                .unwrap_or(0)
        });
    }
    for a in &agents {
        println!("{}\t{}", a.name, render::status(a));
    }
    // Why, where the user is: the detail and the end of the stderr.
    crate::logs::explain_failures(&crate::logs::Source::Api(r), &agents).await;
    if timed_out {
        return Ok(2);
    }
    Ok(agents
        .iter()
        .map(|a| wait_code_of(&a.state))
        .max()
        .unwrap_or(0))
}

/// `cancel`, `close` or `resume`: one line, `name<TAB>status[<TAB>run]`.
pub(crate) async fn act(r: &Remote, verb: &str, name: &str, body: Option<Value>) -> Result<i32> {
    let v = r
        .call("POST", &format!("/api/agents/{name}/{verb}"), body)
        .await?;
    let mut a: brood_api::Agent = typed(&v)?;
    // A cancel answers once the stop is recorded; the person asked for the
    // agent to be cancelled, so say so once it is (within the grace period
    // and the kill after it, as `wait` would).
    // The look is best-effort: an agent not granted `wait` still cancels.
    if verb == "cancel"
        && a.state.starts_with("stopping/")
        && let Ok(v) = r
            .call(
                "POST",
                &format!("/api/agents/{name}/wait"),
                Some(json!({"timeout_s": CANCEL_WAIT_S})),
            )
            .await
        && let Ok(w) = typed::<brood_api::WaitReply>(&v)
        && let Some(now) = w.agents.into_iter().next()
    {
        a = now;
    }
    match verb {
        "resume" => println!("{}\t{}\t{}", a.name, render::status(&a), a.run),
        _ => println!("{}\t{}", a.name, render::status(&a)),
    }
    Ok(0)
}

fn checked(name: &str) -> Result<brood_core::AgentName> {
    brood_core::AgentName::new(name).map_err(|e| Exit(3, e.to_string()).into())
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub(crate) async fn ps(
    r: &Remote,
    root: &Option<PathBuf>,
    all: bool,
    json_out: bool,
) -> Result<i32> {
    let l: brood_api::AgentList = match r.read(&format!("/api/agents?all={all}")).await? {
        Some(v) => typed(&v)?,
        None => api(view(root)?.list(None, all))?,
    };
    if json_out {
        println!("{}", to_value(&l.agents));
    } else {
        print!("{}", render::table(&l.agents));
    }
    Ok(0)
}

pub(crate) async fn nodes(r: &Remote, root: &Option<PathBuf>, json_out: bool) -> Result<i32> {
    let l: brood_api::NodeList = match r.read("/api/nodes").await? {
        Some(v) => typed(&v)?,
        None => {
            // Read from the store with each heartbeat's age on its clock,
            // as a daemon answers it: this machine's clock is no judge.
            let store = view(root)?.store().clone();
            api(brood_runtime::nodes::list(store.as_ref()))?
        }
    };
    if json_out {
        println!("{}", to_value(&l.nodes));
        return Ok(0);
    }
    for n in &l.nodes {
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{}\t{}\t{}\t{} agents{}\theartbeat {:.1} s ago\t{}",
            n.id,
            if n.alive { "alive" } else { "expired" },
            n.address,
            n.live_agents,
            n.capacity.map(|c| format!(" of {c}")).unwrap_or_default(),
            n.heartbeat_age_ms as f64 / 1000.0,
            labels.join(",")
        );
    }
    Ok(0)
}

pub(crate) async fn tree(
    r: &Remote,
    root: &Option<PathBuf>,
    name: Option<String>,
    json_out: bool,
) -> Result<i32> {
    let name = name.as_deref().map(checked).transpose()?;
    let path = match &name {
        Some(n) => format!("/api/tree?root={n}"),
        None => "/api/tree".to_owned(),
    };
    let t: brood_api::Trees = match r.read(&path).await? {
        Some(v) => typed(&v)?,
        None => api(view(root)?.tree(name.as_ref()))?,
    };
    if json_out {
        println!("{}", to_value(&t.trees));
    } else {
        for t in &t.trees {
            print!("{}", render::tree(t));
        }
    }
    Ok(0)
}

pub(crate) async fn show(
    r: &Remote,
    root: &Option<PathBuf>,
    name: &str,
    json_out: bool,
) -> Result<i32> {
    let name = checked(name)?;
    let (d, src): (brood_api::AgentDetail, _) = match r.read(&format!("/api/agents/{name}")).await?
    {
        Some(v) => (typed(&v)?, crate::logs::Source::Api(r)),
        None => (
            api(view(root)?.show(&name))?,
            crate::logs::Source::local(crate::root_of(root))?,
        ),
    };
    if json_out {
        println!("{}", to_value(&d));
        return Ok(0);
    }
    // The tails are extras: a record that reads is shown even when they do not.
    let mut messages = Vec::new();
    while let Ok(page) = src
        .transcript(
            &d.agent,
            messages
                .last()
                .map_or(0, |m: &brood_api::MessageView| m.seq),
        )
        .await
    {
        if page.is_empty() {
            break;
        }
        messages.extend(page);
    }
    let log = match src.log(&name, 0, Some(4 * crate::logs::TAIL_LINES)).await {
        Ok(l) => crate::logs::last_lines(&l.entries, None, crate::logs::TAIL_LINES),
        Err(_) => Vec::new(),
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let tails = render::Tails {
        messages: &messages,
        log: &log,
        now_ms,
    };
    print!("{}", render::show(&d, &tails));
    Ok(0)
}

/// `brood events [-f]`: the API's event stream (SSE) when a daemon answers,
/// else the store (polled when following).
pub(crate) async fn events(
    r: &Remote,
    root: &Option<PathBuf>,
    name: Option<String>,
    follow: bool,
    format: &str,
) -> Result<i32> {
    let fmt = EventFormat::parse(format).ok_or_else(|| {
        Exit(
            2,
            format!("--format {format:?}: unknown event format; use brood or agentruntime"),
        )
    })?;
    let name = name.as_deref().map(checked).transpose()?;
    let mut path = format!("/api/events?format={format}&follow={follow}");
    if let Some(n) = &name {
        path.push_str(&format!("&agent={n}"));
    }
    // A subscriber that fell behind is told to resync: it reconnects from
    // the last event it printed, so nothing is lost or printed twice.
    let mut last_id: Option<String> = None;
    loop {
        let mut resync = false;
        let mut out = std::io::stdout().lock();
        let from = last_id.clone();
        let streamed = brood_server::client::stream(r.endpoint(), &path, from.as_deref(), |e| {
            if e.event.as_deref() == Some("resync") {
                resync = true;
                return false;
            }
            use std::io::Write;
            if writeln!(out, "{}", e.data)
                .and_then(|_| out.flush())
                .is_err()
            {
                return false;
            }
            if e.id.is_some() {
                last_id = e.id;
            }
            true
        })
        .await;
        drop(out);
        match streamed {
            Ok(None) if resync => continue,
            Ok(None) => return Ok(0),
            Ok(Some(answer)) => {
                crate::remote::ok(answer)?;
                return Ok(0);
            }
            Err(e)
                if !matches!(
                    r.endpoint(),
                    brood_server::client::Endpoint::Unix(_)
                        | brood_server::client::Endpoint::Door(_)
                ) =>
            {
                return Err(Exit(1, format!("no brood supervisor answers ({e})")).into());
            }
            Err(_) => break,
        }
    }
    // No daemon: the store, which must know the agent named.
    let v = view(root)?;
    if let Some(n) = &name {
        api(v.agent(n))?;
    }

    let mut after = 0;
    loop {
        let batch = v
            .store()
            .events(v.tenant(), after, name.as_ref(), 1000)
            .context("reading events")?;
        for e in &batch {
            after = e.seq;
            match fmt {
                EventFormat::Brood => println!("{}", to_value(&brood_server::event_json(e))),
                // Events the standard has no counterpart for are left out.
                EventFormat::AgentRuntime => {
                    if let Some(x) = to_agentruntime(e) {
                        println!("{x}");
                    }
                }
            }
        }
        if !follow {
            return Ok(0);
        }
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
