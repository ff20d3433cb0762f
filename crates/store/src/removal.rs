//! Removing a finished tree or a job (issue 25, [`crate::Removal`]), written
//! once for both stores over [`Db`], inside the store's transaction: the
//! walk, the checks and the order of the deletes. The SQL is the standard
//! both speak (`?N` parameters, read as `$N` on PostgreSQL).
//!
//! Every table that holds a row of an agent is emptied of the removed ones:
//! `messages events runs channels edges inbox`, the jobs they own
//! (`jobs job_items job_attempts`), the blobs only their channels named
//! (`blobs blob_chunks`), then `agents`, children before their parent so
//! no foreign key ever points at a row already gone. Idempotency keys keep
//! their replies (they are the callers', and expire), and the tenant's
//! event numbering goes on from where it was: a removed event's number is
//! never given again.

use std::collections::{BTreeSet, HashSet};

use brood_core::{AgentName, Code, JobStatus, TenantId};

use crate::db::{Db, Row, Value, narrow, not_found, parse};
use crate::jobs::load_job;
use crate::types::{Agent, Channel, FinishedTree, NewEvent, Removed, RemovedJob, StoreError};

/// The most agents one removal walks: far past any tree a quota lets grow
/// (SPEC 9 ceiling: 100,000), so reaching it means the parents loop.
const MAX_AGENTS: usize = 1_000_000;

const Q_JOBS_OWNED: &str = "SELECT id, status FROM jobs WHERE tenant = ?1 AND owner = ?2";
const Q_CUSTOMERS_IN_TREE: &str = "SELECT name, customer FROM agents \
     WHERE tenant = ?1 AND root = ?2 AND customer IS NOT NULL";
const Q_RUN_CGROUPS: &str = "SELECT cgroup FROM runs \
     WHERE tenant = ?1 AND agent = ?2 AND cgroup IS NOT NULL AND cgroup <> ''";
const Q_CHANNEL_ARTIFACTS: &str = "SELECT artifacts FROM channels \
     WHERE tenant = ?1 AND parent = ?2 AND artifacts IS NOT NULL";
// A blob still named by a channel that stays: its hash (64 hex digits)
// appears in that channel's artifacts JSON. A scan of the tenant's channels,
// once per blob a removal gave up; removal is no hot path.
const Q_BLOB_NAMED: &str =
    "SELECT child FROM channels WHERE tenant = ?1 AND artifacts LIKE ?2 LIMIT 1";
const Q_JOB_WORKERS: &str = "SELECT DISTINCT worker FROM job_attempts \
     WHERE tenant = ?1 AND job = ?2 AND worker IS NOT NULL";
const U_NO_CUSTOMER: &str = "UPDATE agents SET customer = NULL WHERE tenant = ?1 AND name = ?2";
const D_MESSAGES: &str = "DELETE FROM messages WHERE tenant = ?1 AND agent = ?2";
const D_EVENTS: &str = "DELETE FROM events WHERE tenant = ?1 AND agent = ?2";
const D_RUNS: &str = "DELETE FROM runs WHERE tenant = ?1 AND agent = ?2";
const D_CHANNELS_OF_PARENT: &str = "DELETE FROM channels WHERE tenant = ?1 AND parent = ?2";
const D_CHANNEL: &str = "DELETE FROM channels WHERE tenant = ?1 AND parent = ?2 AND child = ?3";
const D_EDGES_OF_PARENT: &str = "DELETE FROM edges WHERE tenant = ?1 AND parent = ?2";
const D_EDGE: &str = "DELETE FROM edges WHERE tenant = ?1 AND parent = ?2 AND child = ?3";
const D_INBOX: &str = "DELETE FROM inbox WHERE tenant = ?1 AND agent = ?2";
const D_ATTEMPTS: &str = "DELETE FROM job_attempts WHERE tenant = ?1 AND job = ?2";
const D_ITEMS: &str = "DELETE FROM job_items WHERE tenant = ?1 AND job = ?2";
const D_JOB: &str = "DELETE FROM jobs WHERE tenant = ?1 AND id = ?2";
const D_BLOB_CHUNKS: &str = "DELETE FROM blob_chunks WHERE tenant = ?1 AND sha256 = ?2";
const D_BLOB: &str = "DELETE FROM blobs WHERE tenant = ?1 AND sha256 = ?2";
const D_AGENT: &str = "DELETE FROM agents WHERE tenant = ?1 AND name = ?2";

/// The query of [`crate::Removal::finished_trees`]: per root, its agents
/// and last change, kept when none is unfinished and no job an agent of it
/// owns is pending or running. `?1` tenant, `?2` the cutoff, `?3` the limit.
const Q_FINISHED_TREES: &str = concat!(
    "SELECT a.root, COUNT(*), MAX(a.updated_ms) FROM agents a WHERE a.tenant = ?1 ",
    "GROUP BY a.root HAVING MAX(a.updated_ms) < ?2 ",
    "AND SUM(CASE WHEN ",
    unfinished!("a."),
    " THEN 1 ELSE 0 END) = 0 ",
    "AND NOT EXISTS (SELECT 1 FROM jobs j JOIN agents o ON o.tenant = j.tenant AND o.name = j.owner ",
    "WHERE j.tenant = ?1 AND o.root = a.root AND (j.status = 'pending' OR j.status = 'running')) ",
    "ORDER BY MAX(a.updated_ms), a.root LIMIT ?3"
);

fn conflict(message: String) -> StoreError {
    StoreError::Refused {
        code: Code::Conflict,
        message,
    }
}

fn text(row: &[Option<String>], i: usize) -> Option<&str> {
    row.get(i).and_then(|c| c.as_deref())
}

/// Every row of `sql`, its first `N` columns as text (`None` for NULL);
/// every parameter is text (names, ids, patterns).
fn rows<D: Db, const N: usize>(
    db: &D,
    sql: &str,
    params: &[&str],
) -> Result<Vec<[Option<String>; N]>, D::Err> {
    let values: Vec<Value<'_>> = params.iter().map(|p| Value::from(*p)).collect();
    db.query(sql, &values, |r| {
        let mut row: [Option<String>; N] = std::array::from_fn(|_| None);
        for (i, c) in row.iter_mut().enumerate() {
            *c = r.text_opt(i)?;
        }
        Ok(row)
    })
}

/// Runs `sql` with text parameters.
fn exec<D: Db>(db: &D, sql: &str, params: &[&str]) -> Result<u64, D::Err> {
    let values: Vec<Value<'_>> = params.iter().map(|p| Value::from(*p)).collect();
    db.exec(sql, &values)
}

/// [`crate::Removal::finished_trees`].
pub(crate) fn finished_trees<D: Db>(
    db: &D,
    tenant: &TenantId,
    ended_before_ms: i64,
    limit: u32,
) -> Result<Vec<FinishedTree>, D::Err> {
    let params = [tenant.as_str().into(), ended_before_ms.into(), limit.into()];
    db.query(Q_FINISHED_TREES, &params, |r| {
        Ok(FinishedTree {
            root: parse("agents.root", r.text(0)?, AgentName::new)?,
            agents: narrow(r.int(1)?, "the count of a tree's agents")?,
            last_end_ms: r.int(2)?,
        })
    })
}

/// `top` and every agent under it, each after its parent.
fn subtree<D: Db>(db: &D, tenant: &TenantId, top: Agent) -> Result<Vec<Agent>, D::Err> {
    let mut seen: HashSet<AgentName> = HashSet::from([top.name.clone()]);
    let mut out = vec![top];
    let mut next = 0;
    while next < out.len() {
        let name = out[next].name.clone();
        next += 1;
        let params = [tenant.as_str().into(), name.as_str().into()];
        for c in db.agents(D::SQL.children, &params)? {
            if !seen.insert(c.name.clone()) || out.len() >= MAX_AGENTS {
                return Err(StoreError::Corrupt {
                    what: "agents.parent",
                    value: format!(
                        "the parents under {tenant}/{} loop at {}",
                        out[0].name, c.name
                    ),
                }
                .into());
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// Why an agent that has not finished keeps its tree.
fn unfinished(a: &Agent, top: &AgentName) -> StoreError {
    let reason = a
        .status
        .reason()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let word = match a.status {
        brood_core::Status::Stopping(_) => "stopping".to_owned(),
        s => s.api_word().to_owned(),
    };
    let whose = if &a.name == top {
        String::new()
    } else {
        format!(" in the tree of {top}")
    };
    conflict(format!(
        "agent {}{whose} is {word}{reason}: only a tree whose every agent has ended is removed \
         (cancel it first, or wait for it)",
        a.name
    ))
}

/// Removes `top`'s subtree: see [`crate::Removal::remove_tree`].
pub(crate) fn remove_subtree<D: Db>(
    db: &D,
    tenant: &TenantId,
    top: &AgentName,
) -> Result<Removed, D::Err> {
    let Some(first) = db.agent(tenant, top)? else {
        return Err(not_found(tenant, top).into());
    };
    let agents = subtree(db, tenant, first)?;
    if let Some(a) = agents.iter().find(|a| !a.status.is_finished()) {
        return Err(unfinished(a, top).into());
    }
    let names: BTreeSet<&str> = agents.iter().map(|a| a.name.as_str()).collect();
    let t = tenant.as_str();
    // The jobs the removed agents own go with them, once finished.
    let mut jobs = Vec::new();
    for a in &agents {
        for row in rows::<_, 2>(db, Q_JOBS_OWNED, &[t, a.name.as_str()])? {
            let (Some(id), Some(status)) = (text(&row, 0), text(&row, 1)) else {
                continue;
            };
            if !JobStatus::parse(status).is_some_and(JobStatus::is_finished) {
                return Err(conflict(format!(
                    "job {id} of agent {} is {status}: cancel it (brood job cancel {id}) or \
                     remove it (brood job rm {id}) before its owner's tree",
                    a.name
                ))
                .into());
            }
            jobs.push(id.to_owned());
        }
    }
    // Customers are in their requester's tree (issue 24): an agent of the
    // tree outside the subtree may still name one of it.
    let root = agents[0].root.as_str();
    let mut customers = BTreeSet::new();
    for row in rows::<_, 2>(db, Q_CUSTOMERS_IN_TREE, &[t, root])? {
        let (Some(name), Some(customer)) = (text(&row, 0), text(&row, 1)) else {
            continue;
        };
        if !names.contains(customer) {
            continue;
        }
        if !names.contains(name) {
            return Err(conflict(format!(
                "agent {name}, outside {top}'s subtree, has {customer} as its customer"
            ))
            .into());
        }
        customers.insert(name.to_owned());
    }
    let channels: Vec<Channel> = match &agents[0].parent {
        Some(p) => {
            let params = [t.into(), p.as_str().into(), top.as_str().into()];
            db.channels(D::SQL.channel, &params)?
        }
        None => Vec::new(),
    };
    let mut shas = BTreeSet::new();
    for c in &channels {
        shas.extend(c.artifacts.iter().map(|a| a.sha256.clone()));
    }
    let mut cgroups = Vec::new();
    for a in &agents {
        for row in rows::<_, 1>(db, Q_CHANNEL_ARTIFACTS, &[t, a.name.as_str()])? {
            if let Some(json) = text(&row, 0) {
                let artifacts = crate::checks::decode_artifacts(json)?;
                shas.extend(artifacts.into_iter().map(|a| a.sha256));
            }
        }
        for row in rows::<_, 1>(db, Q_RUN_CGROUPS, &[t, a.name.as_str()])? {
            if let Some(cg) = text(&row, 0) {
                cgroups.push(cg.to_owned());
            }
        }
    }
    for name in &customers {
        exec(db, U_NO_CUSTOMER, &[t, name])?;
    }
    for id in &jobs {
        for sql in [D_ATTEMPTS, D_ITEMS, D_JOB] {
            exec(db, sql, &[t, id])?;
        }
    }
    if let Some(p) = &agents[0].parent {
        exec(db, D_CHANNEL, &[t, p.as_str(), top.as_str()])?;
        exec(db, D_EDGE, &[t, p.as_str(), top.as_str()])?;
    }
    // Every row that names an agent first (a message before its run), so
    // no foreign key points at an agent when it goes; then the agents,
    // children before their parent, for `agents.parent`.
    for a in &agents {
        let n = a.name.as_str();
        for sql in [
            D_MESSAGES,
            D_EVENTS,
            D_RUNS,
            D_CHANNELS_OF_PARENT,
            D_EDGES_OF_PARENT,
            D_INBOX,
        ] {
            exec(db, sql, &[t, n])?;
        }
    }
    for a in agents.iter().rev() {
        exec(db, D_AGENT, &[t, a.name.as_str()])?;
    }
    let mut blobs = Vec::new();
    for sha in shas {
        let pattern = format!("%{sha}%");
        if rows::<_, 1>(db, Q_BLOB_NAMED, &[t, &pattern])?.is_empty() {
            exec(db, D_BLOB_CHUNKS, &[t, &sha])?;
            exec(db, D_BLOB, &[t, &sha])?;
            blobs.push(sha);
        }
    }
    Ok(Removed {
        agents,
        channels,
        jobs,
        cgroups,
        blobs,
    })
}

/// Whether `name` is one of the workers job `job` created (`<job>-w<n>`).
pub fn is_job_worker(job: &str, name: &str) -> bool {
    name.strip_prefix(job)
        .and_then(|r| r.strip_prefix("-w"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes job `id`: see [`crate::Removal::remove_job`].
pub(crate) fn remove_job<D: Db>(
    db: &D,
    tenant: &TenantId,
    id: &str,
    events: &[NewEvent],
    now_ms: i64,
) -> Result<RemovedJob, D::Err> {
    let Some(job) = load_job(db, tenant, id)? else {
        return Err(StoreError::Refused {
            code: Code::NotFound,
            message: format!("no job {id:?}"),
        }
        .into());
    };
    if job.status == JobStatus::Running {
        return Err(conflict(format!(
            "job {id} is running: cancel it first (brood job cancel {id}), then remove it once \
             its workers have ended"
        ))
        .into());
    }
    let t = tenant.as_str();
    let mut workers = Vec::new();
    for row in rows::<_, 1>(db, Q_JOB_WORKERS, &[t, id])? {
        let Some(w) = text(&row, 0).filter(|w| is_job_worker(id, w)) else {
            continue;
        };
        let Ok(name) = AgentName::new(w) else {
            continue;
        };
        // A worker already removed with its own subtree is no more.
        if let Some(a) = db.agent(tenant, &name)?
            && a.parent.as_ref() == Some(&job.owner)
        {
            workers.push(name);
        }
    }
    for sql in [D_ATTEMPTS, D_ITEMS, D_JOB] {
        exec(db, sql, &[t, id])?;
    }
    let mut removed = Removed::default();
    for w in &workers {
        removed.extend(remove_subtree(db, tenant, w)?);
    }
    db.append_events(tenant, events, now_ms)?;
    Ok(RemovedJob {
        job,
        workers: removed,
    })
}

#[cfg(test)]
mod tests {
    use super::is_job_worker;

    #[test]
    fn a_jobs_own_workers_are_named_after_it() {
        assert!(is_job_worker("j", "j-w1"));
        assert!(is_job_worker("j", "j-w20"));
        assert!(!is_job_worker("j", "j-w"));
        assert!(!is_job_worker("j", "j-wx"));
        assert!(!is_job_worker("j", "j2-w1"));
        assert!(!is_job_worker("j", "k-w1"));
    }
}
