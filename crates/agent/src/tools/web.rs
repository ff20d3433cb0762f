//! `web_search`, offered only when a search endpoint is configured
//! (`search_url`): `GET <search_url>?q=<query>`, its answer given to the
//! model as it came (capped).

use std::time::Duration;

use serde_json::Value;

use super::{ToolResult, arg};
use crate::settings::Settings;

pub fn run(args: &Value, settings: &Settings) -> ToolResult {
    let query = arg(args, "query")?;
    let Some(url) = &settings.search_url else {
        return Err(
            "no search endpoint is configured (search_url in the agent configuration)".into(),
        );
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .get(url)
        .query("q", query)
        .call()
        .map_err(|e| format!("the search endpoint {url} cannot be reached: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("reading the search answer: {e}"))?;
    if status != 200 {
        return Err(format!(
            "the search endpoint answered {status}: {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    Ok(body)
}
