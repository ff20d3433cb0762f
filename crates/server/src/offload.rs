//! Requests off the runtime's workers, on PostgreSQL. The handlers read the
//! store through its blocking facade, inline: a read of a PostgreSQL that
//! does not answer holds its thread until the store's deadline (20 s).
//! `brood serve` has two worker threads, so two such reads held every
//! request behind them, `/healthz` included: any caller could stall the
//! daemon while the store was slow or away.
//!
//! Each request therefore runs on a thread of the runtime's blocking pool
//! while the worker that took it only awaits its answer, at most
//! [`AT_ONCE`] at a time; past that a request is refused at once with 503
//! and `Retry-After`, so a flood of reads of a silent store costs a bounded
//! number of threads, not a thread each. `/healthz` never queues behind
//! them: it reads nothing of the store; nor does a wait (`POST
//! /api/agents/{name}/wait`), a long poll of the loop that would hold a
//! thread for its whole timeout.

use std::sync::{Arc, LazyLock};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::ApiError;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;

use crate::error::HttpError;
use crate::state::Api;

/// Requests running off the workers at once. Each holds a thread while it
/// waits; a hundred clients of a healthy store never reach this.
pub(crate) const AT_ONCE: usize = 256;

static SLOTS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(AT_ONCE)));

pub(crate) async fn off_the_workers(State(api): State<Api>, req: Request, next: Next) -> Response {
    // `/healthz` is answered from memory: never behind a store that does
    // not answer. A wait is a long poll of the loop, not of the store, and
    // would hold a thread for all its timeout. A runtime of one thread (an
    // in-process caller's) has no worker to hand over, and runs the
    // request where it is.
    //
    // A store in a file under the root (SQLite) is read inline: its reads
    // are local and cannot be held by a network that went silent, and
    // handing each request to another thread cost a quarter of the reads
    // a second (`brood bench api`'s GET, 18,000 to 13,000 a second).
    let path = req.uri().path();
    if !api.sup().paths().db_is_postgres()
        || path == "/healthz"
        || path.ends_with("/wait")
        || Handle::current().runtime_flavor() != RuntimeFlavor::MultiThread
    {
        return next.run(req).await;
    }
    let Ok(_held) = SLOTS.clone().try_acquire_owned() else {
        return HttpError(
            ApiError::new(
                Code::Unavailable,
                format!(
                    "{AT_ONCE} requests are already waiting on the store; ask again (see the supervisor's log)"
                ),
            )
            .retry_after(1),
        )
        .into_response();
    };
    // The request's future runs to its answer on a thread of the blocking
    // pool, and this task (a worker's) only awaits it. `block_in_place`
    // would hand the worker's queue to a fresh thread instead, but a
    // request that makes requests of its own (an MCP tool call goes through
    // the router again) left both workers parked in their `block_on`s with
    // nobody to run the queue: the MCP tests hung.
    let handle = Handle::current();
    match tokio::task::spawn_blocking(move || handle.block_on(next.run(req))).await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::error!(error = %e, "a request's thread ended without an answer");
            HttpError(ApiError::new(
                Code::Internal,
                "the request failed (see the supervisor's log)",
            ))
            .into_response()
        }
    }
}
