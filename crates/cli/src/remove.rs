//! `brood rm` and `brood prune` (issue 25): finished trees removed, their
//! names free again. Through the daemon (or `brood run`) that serves the
//! root when one answers on its socket, as every verb; otherwise on the
//! store itself, as the operator (`brood_runtime::remove`).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use brood_core::{AgentName, Code, TenantId};
use brood_runtime::Caller;
use brood_runtime::paths::Paths;
use serde_json::json;

use crate::remote::{Remote, typed};
use crate::{Exit, api, render, root_of, unsafe_uid};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A duration as people write it: a number and a unit, `90s`, `30m`, `12h`,
/// `7d`, `2w`, or several (`1h30m`); in seconds.
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = |why: &str| {
        format!(
            "{text:?} is not a duration ({why}); write a number and a unit: 90s, 30m, 12h, 7d, 2w"
        )
    };
    let mut total: u64 = 0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad("it is empty"));
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad("a unit without a number"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| bad("the number is too large"))?;
        rest = &rest[digits..];
        let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let scale = match &rest[..unit] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            "" => return Err(bad("a number without a unit")),
            _ => return Err(bad(&format!("unknown unit {:?}", &rest[..unit]))),
        };
        rest = &rest[unit..];
        total = n
            .checked_mul(scale)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| bad("it is too long"))?;
    }
    Ok(total)
}

/// The root without a daemon: its store, opened for writing, and its layout.
struct Here {
    store: std::sync::Arc<dyn brood_store::Store>,
    tenant: TenantId,
    paths: Paths,
    caller: Caller,
}

/// The root's store, or `None` when its file does not exist yet (no agent
/// was ever made there: there is nothing to remove, and nothing is created).
fn here(root: &Option<PathBuf>) -> Result<Option<Here>> {
    let db = crate::store_file(root);
    if !brood_store::is_postgres_url(&db.to_string_lossy()) && !db.exists() {
        return Ok(None);
    }
    let store = brood_store::open(&db.to_string_lossy()).map_err(|e| {
        Exit(
            1,
            format!("opening the store {}: {e}", crate::store_url::shown(&db)),
        )
    })?;
    let uid = unsafe_uid();
    Ok(Some(Here {
        store,
        tenant: TenantId::for_uid(uid),
        paths: Paths::new(root_of(root), uid).with_db(Some(db)),
        caller: Caller::User { uid },
    }))
}

fn tree_line(t: &brood_api::RemovedTree, verb: &str, now: i64) -> String {
    let last = t
        .last_end_ms
        .map(|ms| format!(", last ended {}", render::when(ms, now)))
        .unwrap_or_default();
    let s = if t.agents == 1 { "" } else { "s" };
    format!("{verb} {} ({} agent{s}{last})", t.root, t.agents)
}

/// `brood rm NAME...`: each root's tree, in turn; a refused one is told on
/// stderr and the rest still removed. Exit 0 when all were, else the first
/// refusal's code.
pub(crate) async fn rm(
    r: &Remote,
    root: &Option<PathBuf>,
    names: &[String],
    json_out: bool,
) -> Result<i32> {
    // `None`: through the API; `Some(None)`: a root with no store yet.
    let local = if r.served() { None } else { Some(here(root)?) };
    let mut code = 0;
    for n in names {
        let done: Result<brood_api::RemovedTree> = async {
            let name = AgentName::new(n).map_err(|e| {
                Exit(
                    Code::NotFound.exit_code(),
                    format!("no agent named {n} ({e})"),
                )
            })?;
            match &local {
                None => typed(
                    &r.call("DELETE", &format!("/api/agents/{name}"), None)
                        .await?,
                ),
                Some(Some(h)) => api(brood_runtime::remove::remove_tree_here(
                    h.store.as_ref(),
                    &h.tenant,
                    &h.paths,
                    &h.caller,
                    &name,
                )),
                Some(None) => {
                    Err(Exit(Code::NotFound.exit_code(), format!("no agent named {name}")).into())
                }
            }
        }
        .await;
        match done {
            Ok(t) if json_out => println!("{}", json!(t)),
            Ok(t) => println!("{}", tree_line(&t, "removed", now_ms())),
            Err(e) => {
                let (c, m) = match e.downcast_ref::<Exit>() {
                    Some(x) => (x.0, x.1.clone()),
                    None => (1, format!("{e:#}")),
                };
                eprintln!("brood: rm {n}: {m}");
                if code == 0 {
                    code = c;
                }
            }
        }
    }
    Ok(code)
}

/// `brood prune --older-than D [--dry-run]`: every finished tree whose last
/// end is at least D old, one line each, then the count.
pub(crate) async fn prune(
    r: &Remote,
    root: &Option<PathBuf>,
    older_than: &str,
    dry_run: bool,
    json_out: bool,
) -> Result<i32> {
    let secs = parse_duration(older_than).map_err(|e| Exit(2, format!("--older-than {e}")))?;
    if secs > brood_api::PRUNE_MAX_AGE_S {
        return Err(Exit(2, format!("--older-than {older_than:?}: at most 100 years")).into());
    }
    let reply: brood_api::PruneReply = if r.served() {
        let body = json!({"older_than_s": secs, "dry_run": dry_run});
        typed(&r.call("POST", "/api/prune", Some(body)).await?)?
    } else {
        match here(root)? {
            Some(h) => api(brood_runtime::remove::prune_here(
                h.store.as_ref(),
                &h.tenant,
                &h.paths,
                (secs * 1000) as i64,
                dry_run,
                now_ms(),
            ))?,
            None => brood_api::PruneReply {
                dry_run,
                removed: Vec::new(),
                skipped: Vec::new(),
            },
        }
    };
    if json_out {
        println!("{}", json!(reply));
        return Ok(0);
    }
    let now = now_ms();
    let verb = if dry_run { "would remove" } else { "removed" };
    for t in &reply.removed {
        println!("{}", tree_line(t, verb, now));
    }
    for s in &reply.skipped {
        eprintln!("skipped {}: {}", s.root, s.reason);
    }
    let n = reply.removed.len();
    let trees = if n == 1 { "tree" } else { "trees" };
    if dry_run {
        println!("{n} {trees} would be removed (a dry run: nothing was)");
    } else {
        println!("{n} {trees} removed");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("12h"), Ok(43_200));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("2w"), Ok(1_209_600));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("0s"), Ok(0));
        for bad in ["", "7", "d", "7y", "-1d", "7 d", "99999999999999999999s"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
