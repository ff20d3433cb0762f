//! Events as the control plane shows them (SPEC 11).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One event of the tenant's log: `sequence` is monotonic per tenant;
/// `event_id` (`<tenant>-<sequence>`) is what SSE's `Last-Event-ID` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub event_id: String,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    pub sequence: i64,
    pub tenant: String,
    pub agent: String,
    pub run: Option<String>,
    pub session: String,
    #[schema(value_type = Object)]
    pub payload: Value,
}
