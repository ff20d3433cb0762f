//! `brood bench admission`: the store alone (records only, no daemon, no
//! process), labelled so wherever it is quoted; `bench cluster` measures the
//! deployment.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use super::pct;

/// `bench admission`: what one creation costs in the store, attenuation
/// included. Every requester creates children under parents of its own, so the
/// quotas are counted (and pass) on every creation.
pub(super) fn run(
    root: &Option<PathBuf>,
    n: usize,
    requesters: usize,
    nodes: usize,
) -> Result<serde_json::Value> {
    use brood_core::attenuation::{ParentView, check, derive};
    use brood_core::policy::{Policy, PolicyRequest};
    use brood_core::quota::Quotas;
    use brood_core::{AgentName, RunId, SessionName, TenantId};
    use brood_store::{NewAgent, NewEvent, SqliteStore, Store};
    use std::sync::Arc;

    let dir = match root {
        Some(r) => r.clone(),
        None => std::env::temp_dir().join(format!("brood-bench-admission-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    // `--store postgres://…` measures that server (each of `nodes` stores a
    // pool of its own, in a tenant of this run's own, so runs never collide);
    // otherwise a fresh SQLite file.
    let pg = crate::store_spec().filter(|s| brood_store::is_postgres_url(s));
    let db = dir.join("admission.db");
    let (stores, backend): (Vec<Arc<dyn Store>>, String) = match &pg {
        Some(url) => {
            let mut v: Vec<Arc<dyn Store>> = Vec::new();
            for _ in 0..nodes {
                v.push(Arc::new(brood_store::postgres::PgStore::open(url)?));
            }
            (
                v,
                format!("PostgreSQL ({nodes} stores of 8 connections, one tenant)"),
            )
        }
        None => {
            let _ = std::fs::remove_file(&db);
            (
                vec![Arc::new(SqliteStore::open(&db)?)],
                "SQLite (WAL, synchronous=NORMAL)".into(),
            )
        }
    };
    let store = stores[0].clone();
    // What one statement's round trip costs through the store's facade: the
    // floor every PostgreSQL admission pays about twenty times.
    let round_trip_us = match &pg {
        Some(url) => {
            let probe = brood_store::postgres::PgStore::open(url)?;
            Some((probe.probe_round_trips(1000)?.as_secs_f64() * 1e3).round())
        }
        None => None,
    };
    let tenant = match &pg {
        Some(_) => TenantId::new(&format!(
            "bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ))?,
        None => TenantId::for_uid(crate::unsafe_uid()),
    };
    let quotas = Quotas::CEILINGS;
    let parent_policy = Policy::operator(0, 0, Default::default());
    let counter = std::sync::atomic::AtomicU64::new(1);
    // Run ids from this run's start, so runs against one server never meet.
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let new_run = || {
        let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RunId::v7(
            epoch + k,
            (k & 0xfff) as u16,
            k ^ u64::from(std::process::id()),
        )
    };
    let admit_on =
        |store: &dyn Store, parent: Option<&AgentName>, name: &AgentName| -> Result<Duration> {
            let t0 = Instant::now();
            let view = ParentView {
                policy: &parent_policy,
                budget_remaining: None,
                creates_used: 0,
                deadline_unix_s: None,
                now_unix_s: 0,
            };
            let child = derive(&view, &PolicyRequest::default());
            check(&view, &child).map_err(|r| anyhow::anyhow!("{r}"))?;
            let session = SessionName::default_session();
            let run = new_run();
            let events = [NewEvent {
                agent: name.clone(),
                run: Some(run.clone()),
                session: session.clone(),
                kind: "agent.spawn".into(),
                payload: json!({"type": "agent.spawn", "agent": name.as_str()}).to_string(),
            }];
            store.admit_with_quotas(
                &NewAgent {
                    tenant: tenant.clone(),
                    name: name.clone(),
                    parent: parent.cloned(),
                    customer: None,
                    session,
                    protocol: brood_store::Protocol::Brood,
                    spec: json!({"argv": ["x"], "policy": brood_proto::policy::to_json(&child)})
                        .to_string(),
                    handoff: String::new(),
                    supervisor: "bench".into(),
                    run,
                    now_ms: 0,
                },
                &quotas,
                &events,
            )?;
            Ok(t0.elapsed())
        };
    let admit =
        |parent: Option<&AgentName>, name: &AgentName| admit_on(store.as_ref(), parent, name);
    // Parents (records only), each taking at most 1,000 children (the fanout ceiling).
    let per_parent = 1000;
    let parents_needed = (2 * n).div_ceil(per_parent) + requesters;
    let parents: Vec<AgentName> = (0..parents_needed)
        .map(|i| AgentName::new(&format!("p{i}")))
        .collect::<Result<_, _>>()?;
    for p in &parents {
        admit(None, p)?;
        // Children are admitted only under a live parent: record one (no process).
        let a = store
            .agent(&tenant, p)?
            .ok_or_else(|| anyhow::anyhow!("parent {p} vanished"))?;
        store.start_run(&tenant, p, &a.run, 1, "", 0, &[])?;
    }
    // One requester.
    let t0 = Instant::now();
    let mut solo = Vec::with_capacity(n);
    for i in 0..n {
        let parent = &parents[i / per_parent];
        solo.push(admit(Some(parent), &AgentName::new(&format!("s{i}"))?)?);
    }
    let solo_rate = n as f64 / t0.elapsed().as_secs_f64();
    // Many requesters at once, each under a parent of its own.
    let base = n.div_ceil(per_parent);
    let each = n.div_ceil(requesters);
    let t0 = Instant::now();
    let lat: Vec<Duration> = std::thread::scope(|sc| -> Result<Vec<Duration>> {
        let handles: Vec<_> = (0..requesters)
            .map(|r| {
                let parent = &parents[base + r];
                let admit_on = &admit_on;
                // Requesters take turns over the nodes' stores.
                let store = stores[r % stores.len()].clone();
                sc.spawn(move || -> Result<Vec<Duration>> {
                    (0..each)
                        .map(|i| {
                            admit_on(
                                store.as_ref(),
                                Some(parent),
                                &AgentName::new(&format!("c{r}-{i}"))?,
                            )
                        })
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a requester panicked"))??,
            );
        }
        Ok(all)
    })?;
    let many_rate = lat.len() as f64 / t0.elapsed().as_secs_f64();
    let (mut solo, mut lat) = (solo, lat);
    solo.sort();
    lat.sort();
    if root.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(json!({
        "bench": "admission", "n": n, "requesters": requesters, "store": backend,
        "pg_round_trip_us": round_trip_us,
        "one_requester_per_s": solo_rate.round(),
        "one_requester_p50_us": pct(&solo, 0.5).as_micros(), "one_requester_p99_us": pct(&solo, 0.99).as_micros(),
        "concurrent_per_s": many_rate.round(),
        "concurrent_p50_us": pct(&lat, 0.5).as_micros(), "concurrent_p99_us": pct(&lat, 0.99).as_micros(),
        "target_per_s": 5000,
        "what": "attenuation (derive + check) and admit_with_quotas (depth, fanout, tree size), all-or-nothing each; on SQLite in BEGIN IMMEDIATE transactions group-committed (a savepoint each), on PostgreSQL a transaction each under the tenant's advisory lock; records only",
    }))
}
