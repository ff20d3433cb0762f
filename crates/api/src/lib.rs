//! brood's control-plane contract (SPEC 11): the request bodies, replies,
//! errors and events of the HTTP API, typed once and shared by every surface
//! that speaks it (the server, the CLI, MCP and the web UI), each with its
//! OpenAPI schema (`utoipa::ToSchema`).
//!
//! Requests are parsed with [`parse`], which names the field that was wrong
//! (`argv[2]: invalid type: integer, expected a string`), so no surface
//! re-parses an untyped `Value` and every one gives the same message.

pub mod agents;
pub mod error;
pub mod events;
pub mod jobs;
pub mod mcp;
pub mod nodes;
pub mod policy;
pub mod removal;
pub mod secrets;
pub mod sessions;
pub mod ui;
pub mod whole;

pub use agents::*;
pub use error::{ErrorBody, ErrorDetail, http_status};
pub use events::Event;
pub use jobs::*;
pub use mcp::SessionStart;
pub use nodes::*;
pub use removal::*;
pub use secrets::Secrets;
pub use sessions::*;
pub use ui::*;

use serde::de::DeserializeOwned;

/// Reads a JSON request body into `T`. The error names the path of the field
/// that failed (`env.HOME`, `argv[1]`) or says the body is not JSON, so the
/// 400 tells the caller what to fix.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let v = serde_path_to_error::deserialize(de).map_err(|e| describe(&e))?;
    Ok(v)
}

/// [`parse`] for a value already read (the child protocol's `request` args).
pub fn parse_value<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| describe(&e))
}

fn describe<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    if matches!(path.as_str(), "." | "?" | "") {
        format!("body: {}", e.inner())
    } else {
        format!("{path}: {}", e.inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_type_names_its_field() {
        let e = parse::<SpawnBody>(br#"{"argv": ["sh", 3]}"#).unwrap_err();
        assert!(e.starts_with("argv[1]:"), "{e}");
        let e = parse::<SpawnBody>(br#"{"argv": ["sh"], "env": {"A": 1}}"#).unwrap_err();
        assert!(e.starts_with("env.A:"), "{e}");
        let e = parse::<SpawnBody>(br#"{"argv": ["sh"], "tsak": "x"}"#).unwrap_err();
        assert!(e.contains("tsak"), "{e}");
        let e = parse::<SpawnBody>(b"{not json").unwrap_err();
        assert!(e.starts_with("body:"), "{e}");
        let e = parse::<SpawnBody>(br#"{}"#).unwrap_err();
        assert!(e.contains("missing field `argv`"), "{e}");
    }
}
