//! A job's creation checked at the door (issue 24): every field in its
//! range before anything is recorded, so nothing a job holds can fail later
//! for a reason seen here (a worker name too long to be an agent's, a
//! worker program that cannot run, a limit the store cannot hold), and the
//! tenant's unfinished jobs and items within their limits.
//!
//! The ranges: `concurrency` 1 to [`CONCURRENCY_MAX`] (a parent has at most
//! that many children at once, SPEC 9's ceiling of `max_fanout`),
//! `max_attempts` 1 to [`MAX_ATTEMPTS_MAX`], `item_timeout_s` and
//! `max_runtime_s` 1 to [`SECONDS_MAX`] (ten years, as an agent's
//! `timeout_s`). A job id is at most [`ID_MAX`] characters and starts with a
//! letter or digit, so its workers' names (`<id>-w<N>`) are agent names.

use std::sync::Mutex;

use brood_api as api;
use brood_core::{Code, TenantId};
use brood_store::Store;

use crate::api::ApiError;
use crate::limits::Limits;

pub const CONCURRENCY_MAX: u32 = 1024;
pub const MAX_ATTEMPTS_MAX: u32 = 100;
pub const SECONDS_MAX: u64 = brood_core::policy::TIMEOUT_MAX;
/// 64 (an agent name's length) less `-w` and ten digits of a worker's number.
pub const ID_MAX: usize = 52;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, m)
}

/// Creations of this process one at a time from their tenant check to their
/// record, so two at once cannot both pass a limit only one fits. (Nodes
/// sharing a store are not serialised with each other: each may let one job
/// past the limit at the same moment.)
pub(super) static CREATING: Mutex<()> = Mutex::new(());

/// A job id: a letter or digit, then letters, digits, `-` and `_`, at most
/// [`ID_MAX`].
pub fn check_id(id: &str) -> Result<(), ApiError> {
    let ok = id.len() <= ID_MAX
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "id: {id:?} is not a job id (a letter or digit, then letters, digits, - and _, at most {ID_MAX})"
        )))
    }
}

fn within(what: &str, v: Option<u64>, max: u64) -> Result<(), ApiError> {
    match v {
        Some(n) if n == 0 || n > max => Err(bad(format!("{what}: {n} must be from 1 to {max}"))),
        _ => Ok(()),
    }
}

/// A word given to the worker program as an argument (`type`, `model`).
fn word(what: &str, v: Option<&String>) -> Result<(), ApiError> {
    match v {
        Some(w) if w.is_empty() || w.chars().any(|c| c.is_control() || c.is_whitespace()) => {
            Err(bad(format!(
                "{what}: {w:?} must be one word without control characters"
            )))
        }
        _ => Ok(()),
    }
}

/// Every field of `body` that needs nothing but itself.
pub fn check_fields(body: &api::JobBody) -> Result<(), ApiError> {
    if body.instruction.contains('\0') {
        return Err(bad("instruction: must not contain a NUL byte"));
    }
    within(
        "concurrency",
        body.concurrency.map(u64::from),
        u64::from(CONCURRENCY_MAX),
    )?;
    within(
        "max_attempts",
        body.max_attempts.map(u64::from),
        u64::from(MAX_ATTEMPTS_MAX),
    )?;
    within("item_timeout_s", body.item_timeout_s, SECONDS_MAX)?;
    within("max_runtime_s", body.max_runtime_s, SECONDS_MAX)?;
    if let Some(w) = &body.worker {
        if let Some(argv) = &w.argv {
            crate::api::check_argv("worker.argv", argv)?;
        }
        word("worker.type", w.kind.as_ref())?;
        word("worker.model", w.model.as_ref())?;
        word("worker.provider", w.provider.as_ref())?;
        if let Some(c) = &w.config {
            brood_core::policy::AbsPath::new("worker.config", c).map_err(|e| bad(e.to_string()))?;
        }
        // They are the reference agent's flags: a worker program of the
        // caller's own takes its configuration in its argv.
        if w.argv.is_some() {
            for (field, given) in [
                ("worker.config", w.config.is_some()),
                ("worker.provider", w.provider.is_some()),
            ] {
                if given {
                    return Err(bad(format!(
                        "{field}: configures the default worker (brood agent); with worker.argv, \
                         pass it in the argv instead"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The tenant's unfinished jobs and their items, with `items` more: within
/// the limits, or the limit that is spent.
pub fn check_tenant(
    store: &dyn Store,
    tenant: &TenantId,
    limits: &Limits,
    items: usize,
) -> Result<(), ApiError> {
    let jobs = store.jobs(tenant).map_err(ApiError::from)?;
    let open: Vec<_> = jobs.iter().filter(|j| !j.status.is_finished()).collect();
    if open.len() >= limits.jobs_per_tenant as usize {
        return Err(ApiError::new(
            Code::QuotaJobs,
            format!(
                "the tenant has {} unfinished jobs, its limit jobs_per_tenant = {}: \
                 wait for one to end, or cancel one",
                open.len(),
                limits.jobs_per_tenant
            ),
        ));
    }
    let held: u64 = open.iter().map(|j| u64::from(j.total)).sum();
    if held + items as u64 > limits.items_per_tenant {
        return Err(ApiError::new(
            Code::QuotaItems,
            format!(
                "the tenant's unfinished jobs hold {held} items and this one {items}: over its \
                 limit items_per_tenant = {}",
                limits.items_per_tenant
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> api::JobBody {
        serde_json::from_value(serde_json::json!({"instruction": "x", "input": "a\n1\n"})).unwrap()
    }

    #[test]
    fn ids_and_ranges_are_refused_naming_the_field() {
        check_id("books-1").unwrap();
        for id in ["", "-x", "_x", "a b", &"x".repeat(ID_MAX + 1)] {
            assert!(check_id(id).unwrap_err().message.starts_with("id:"), "{id}");
        }
        check_id(&"x".repeat(ID_MAX)).unwrap();
        type Set = Box<dyn Fn(&mut api::JobBody)>;
        let cases: Vec<(&str, Set)> = vec![
            ("concurrency", Box::new(|b| b.concurrency = Some(u32::MAX))),
            ("concurrency", Box::new(|b| b.concurrency = Some(0))),
            ("max_attempts", Box::new(|b| b.max_attempts = Some(101))),
            (
                "item_timeout_s",
                Box::new(|b| b.item_timeout_s = Some(u64::MAX)),
            ),
            ("max_runtime_s", Box::new(|b| b.max_runtime_s = Some(0))),
            ("instruction", Box::new(|b| b.instruction = "a\0b".into())),
            (
                "worker.argv",
                Box::new(|b| {
                    b.worker = Some(api::WorkerBody {
                        argv: Some(vec![]),
                        ..Default::default()
                    })
                }),
            ),
            (
                "worker.argv[1]",
                Box::new(|b| {
                    b.worker = Some(api::WorkerBody {
                        argv: Some(vec!["/bin/true".into(), "a\0".into()]),
                        ..Default::default()
                    })
                }),
            ),
            (
                "worker.type",
                Box::new(|b| {
                    b.worker = Some(api::WorkerBody {
                        kind: Some("a b".into()),
                        ..Default::default()
                    })
                }),
            ),
        ];
        for (field, set) in cases {
            let mut b = body();
            set(&mut b);
            let e = check_fields(&b).unwrap_err();
            assert!(
                e.message.starts_with(&format!("{field}:")),
                "{field}: {}",
                e.message
            );
        }
        check_fields(&body()).unwrap();
    }
}
