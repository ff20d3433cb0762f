//! The handlers of SPEC 11's routes, by group; `crate::app` puts them
//! behind one router.

mod agents;
mod job_control;
mod jobs;
mod meta;
mod removal;
mod sessions;
mod ui;

pub(crate) use agents::*;
pub(crate) use job_control::*;
pub(crate) use jobs::*;
pub(crate) use meta::*;
pub(crate) use removal::*;
pub(crate) use sessions::*;
pub(crate) use ui::*;

use brood_core::{AgentName, Code};
use brood_runtime::ApiError;

use crate::error::HttpError;

/// An agent named in a path: a name that cannot exist is simply not found.
pub(crate) fn path_name(s: &str) -> Result<AgentName, HttpError> {
    AgentName::new(s).map_err(|e| {
        HttpError(ApiError::new(
            Code::NotFound,
            format!("no agent named {s:?} ({e})"),
        ))
    })
}
