//! The web UI shows what each model call cost (issue 31): an agent calls
//! its model through the gateway of a real `brood serve --listen` (one call
//! answered by a loopback provider, one for a model its policy does not
//! grant), and its page in headless Chromium lists both calls as brood
//! counted them: model, tokens, cost, latency and outcome.
//!
//! Missing Chromium, chromedriver or Selenium is a failure naming what is
//! missing, never a skip.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod ui_support;

use serde_json::json;
use ui_support::{Browser, Served};

#[test]
fn an_agents_page_shows_each_model_call_and_its_cost() {
    let port = common::model::fixed_usage_provider();
    let dir = tempfile::tempdir().unwrap();
    let config = common::model::gateway_config(dir.path(), port, "m-ui", "m-other");
    let s = Served::start_with(&["--config", config.to_str().unwrap()]);
    let call = common::model::curl_chat_call;
    let script = format!("{}; {}; sleep 60", call("m-ui"), call("m-other"));
    s.spawn(json!({
        "name": "caller", "protocol": "exec", "argv": ["sh", "-c", script],
        "policy": {"models": ["m-ui"]},
    }));

    let mut b = Browser::start();
    b.get(&s.url(&format!("/ui?token={}", s.token)));
    b.view("#/agent/caller");
    b.wait("#agent-name", "caller");
    // The granted call, as brood counted it: $2/M in and $10/M out.
    let rows = b.wait("#model-calls", "refused");
    assert!(rows.contains("m-ui"), "{rows}");
    assert!(rows.contains("1000 / 500"), "{rows}");
    assert!(rows.contains("$0.0070"), "{rows}");
    assert!(rows.contains("ok"), "{rows}");
    // The ungranted one: refused, never sent, nothing spent.
    assert!(rows.contains("m-other"), "{rows}");
    assert!(rows.contains("$0.0000"), "{rows}");
    assert_eq!(
        b.js("return document.querySelectorAll('#model-calls tr').length"),
        json!(2)
    );
    assert_eq!(
        b.js("return document.getElementById('no-model-calls')"),
        json!(null)
    );
    // The same spend in the agent's own figures.
    let own = s.agent("caller")["spend"]["own"]["cost_usd"]
        .as_f64()
        .unwrap();
    assert!((own - 0.007).abs() < 1e-9, "{own}");
    s.ok("POST", "/api/agents/caller/cancel", json!({}));
}
