//! Issue 31's rate limits on model calls, attacked as a hostile child
//! would: a child that loops calls through the gateway is answered 429
//! with `Retry-After` at its policy's `model_rate.requests_per_minute`,
//! and at its `tokens_per_minute` once what brood metered reached it, and
//! the provider sees no call past the limit, even of twenty sent at once;
//! a child asking a higher limit than its parent holds is refused at
//! creation naming the field; a child that asks nothing holds its
//! parent's limit; the tenant's limit (`[quotas.models]`, in a real `brood
//! serve`'s configuration for requests) holds across two agents, for
//! requests and for tokens. The provider is a loopback server written here
//! that counts what reached it and answers every call with 1000 input and
//! 500 output tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brood_core::Code;
use brood_runtime::models::{Kind, Price, Providers, Upstream as Provider};
use common::*;
use serde_json::{Value, json};

/// A loopback OpenAI provider on plain threads: records the model of each
/// chat completion that reached it, answers each with 1000 tokens in and
/// 500 out.
struct Upstream {
    base_url: String,
    models: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    fn start() -> Upstream {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}", l.local_addr().unwrap());
        let models = Arc::new(Mutex::new(Vec::new()));
        let seen = models.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let seen = seen.clone();
                std::thread::spawn(move || answer(c, &seen));
            }
        });
        Upstream { base_url, models }
    }

    fn seen(&self) -> Vec<String> {
        self.models.lock().unwrap().clone()
    }
}

fn answer(c: std::net::TcpStream, seen: &Mutex<Vec<String>>) {
    let Some(body) = common::model::read_body(&c) else {
        return;
    };
    let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = req["model"].as_str().unwrap_or("").to_owned();
    seen.lock().unwrap().push(model.clone());
    let answer = json!({
        "id": "c-1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    });
    common::model::write_json(c, &answer);
}

/// A supervisor in this process whose gateway forwards to `up`, pricing
/// `m-1` at $1 a million tokens in and $2 out.
fn start_gw(up: &Upstream, f: impl FnOnce(&mut brood_runtime::Config)) -> Env {
    let providers = Providers {
        openai: Some(Provider {
            kind: Kind::OpenAi,
            base_url: up.base_url.clone(),
            key: None,
            key_file: None,
        }),
        anthropic: None,
        prices: [(
            "m-1".to_owned(),
            Price {
                input: 1.0,
                output: 2.0,
            },
        )]
        .into(),
    };
    start_with(Duration::from_millis(300), |cfg| {
        cfg.gateway = Some(brood_runtime::Gateway {
            host: brood_server::gateway::host(),
            providers: Arc::new(providers),
        });
        f(cfg);
    })
}

/// A shell script that calls the gateway `n` times in a row, one after
/// the other: each answer's body in `{dir}/{tag}-body-{i}`, and a line
/// `{status} {Retry-After}` for each in `{dir}/{tag}-codes`; then
/// `{dir}/{tag}-done`.
fn looper(dir: &Path, tag: &str, n: usize) -> String {
    let d = dir.display();
    format!(
        "for i in $(seq 1 {n}); do \
           curl -sS -o {d}/{tag}-body-$i -w '%{{http_code}} %header{{retry-after}}\\n' \
             -H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' \
             -d '{{\"model\": \"m-1\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}]}}' \
             \"$OPENAI_BASE_URL/chat/completions\" >> {d}/{tag}-codes; \
         done; touch {d}/{tag}-done"
    )
}

/// The `(status, Retry-After)` of each call the looper `tag` made.
fn codes(dir: &Path, tag: &str) -> Vec<(u16, Option<u64>)> {
    std::fs::read_to_string(dir.join(format!("{tag}-codes")))
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let status = w.next().unwrap().parse().unwrap();
            (status, w.next().map(|r| r.parse().unwrap()))
        })
        .collect()
}

fn body(dir: &Path, tag: &str, i: usize) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join(format!("{tag}-body-{i}"))).unwrap()).unwrap()
}

/// An exec agent running `script`, under `parent` when given.
fn exec(n: &str, script: &str, parent: Option<&str>, policy: Value) -> brood_runtime::SpawnRequest {
    let mut r = req(n, vec!["/bin/sh".into(), "-c".into(), script.into()]);
    r.protocol = brood_store::Protocol::Exec;
    r.parent = parent.map(name);
    r.policy = Some(policy);
    r
}

/// Files: everything readable, `dir` writable.
fn files(dir: &Path) -> Value {
    json!([{"path": "/", "mode": "ro"}, {"path": dir.to_str().unwrap(), "mode": "rw"}])
}

/// The agent's `agent.model.call` events, from the store.
fn calls_of(env: &Env, n: &str) -> Vec<Value> {
    let view = env.sup.view();
    view.store()
        .events(view.tenant(), 0, Some(&name(n)), 10_000)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "agent.model.call")
        .map(|e| serde_json::from_str(&e.payload).unwrap())
        .collect()
}

/// Each refusal is 429 with a `Retry-After` of whole seconds within the
/// minute, the body naming the limit and saying the same wait.
fn assert_refused(dir: &Path, tag: &str, i: usize, retry: Option<u64>, limit: Value) {
    let b = body(dir, tag, i);
    let e = &b["error"];
    assert_eq!(e["code"], "rate_limit_exceeded", "{b}");
    assert_eq!(e["type"], "rate_limit_exceeded", "{b}");
    for (k, v) in limit.as_object().unwrap() {
        assert_eq!(&e["limit"][k], v, "{k} of {b}");
    }
    let field = e["limit"]["field"].as_str().unwrap();
    assert!(e["message"].as_str().unwrap().contains(field), "{b}");
    let r = retry.expect("a 429 has Retry-After");
    assert!((1..=60).contains(&r), "Retry-After {r}");
    assert_eq!(e["retry_after_s"].as_u64(), Some(r), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_looping_calls_is_refused_429_at_its_requests_a_minute_and_none_is_sent() {
    let up = Upstream::start();
    let env = start_gw(&up, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The parent holds three calls a minute and hands the child the same,
    // asked for in the child's own policy.
    env.sup
        .spawn(
            me(),
            exec(
                "p",
                "sleep 60",
                None,
                json!({"model_rate": {"requests_per_minute": 3}}),
            ),
        )
        .await
        .unwrap();
    let policy = json!({"files": files(d), "model_rate": {"requests_per_minute": 3}});
    env.sup
        .spawn(me(), exec("looper", &looper(d, "l", 12), Some("p"), policy))
        .await
        .unwrap();
    let shown = wait_end(&env, "looper").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let got = codes(d, "l");
    assert_eq!(got.len(), 12, "{got:?}");
    assert!(got[..3].iter().all(|(s, _)| *s == 200), "{got:?}");
    assert!(got[3..].iter().all(|(s, _)| *s == 429), "{got:?}");
    // The provider saw the three, nothing of the nine refused.
    assert_eq!(up.seen().len(), 3, "{:?}", up.seen());
    for (i, (_, retry)) in got.iter().enumerate().skip(3) {
        assert_refused(
            d,
            "l",
            i + 1,
            *retry,
            json!({"scope": "agent", "measure": "requests_per_minute",
                   "field": "model_rate.requests_per_minute", "value": 3, "used": 3}),
        );
    }
    // Each call is in the agent's log: three sent, nine refused 429,
    // each refusal naming the limit.
    let calls = calls_of(&env, "looper");
    assert_eq!(calls.len(), 12, "{calls:?}");
    let ok = calls.iter().filter(|c| c["outcome"] == "ok").count();
    assert_eq!(ok, 3, "{calls:?}");
    let refused: Vec<&Value> = calls.iter().filter(|c| c["outcome"] == "refused").collect();
    assert_eq!(refused.len(), 9, "{calls:?}");
    for c in refused {
        assert_eq!(c["status"], 429, "{c}");
        assert_eq!(c["tokens_in"], 0, "{c}");
        let detail = c["detail"].as_str().unwrap();
        assert!(detail.contains("model_rate.requests_per_minute = 3"), "{c}");
    }
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// Twenty calls at once, each on its own connection: the window is
/// checked and counted in one step on the dispatcher, so exactly the limit
/// is sent, however the calls interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_calls_at_once_send_exactly_the_requests_a_minute() {
    let up = Upstream::start();
    let env = start_gw(&up, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let one = |i: usize| {
        format!(
            "curl -sS -o {d}/c-body-{i} -w '%{{http_code}} %header{{retry-after}}\\n' \
               -H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'content-type: application/json' \
               -d '{{\"model\": \"m-1\", \"messages\": []}}' \
               \"$OPENAI_BASE_URL/chat/completions\" > {d}/c-code-{i} &",
            d = d.display()
        )
    };
    let script = format!("{} wait", (1..=20).map(one).collect::<Vec<_>>().join(" "));
    let policy = json!({"files": files(d), "model_rate": {"requests_per_minute": 5}});
    env.sup
        .spawn(me(), exec("burst", &script, None, policy))
        .await
        .unwrap();
    let shown = wait_end(&env, "burst").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let got: Vec<String> = (1..=20)
        .map(|i| std::fs::read_to_string(d.join(format!("c-code-{i}"))).unwrap())
        .collect();
    let sent = got.iter().filter(|c| c.starts_with("200")).count();
    let refused = got.iter().filter(|c| c.starts_with("429 ")).count();
    assert_eq!((sent, refused), (5, 15), "{got:?}");
    assert_eq!(up.seen().len(), 5, "{:?}", up.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_refused_429_once_its_metered_tokens_reach_its_tokens_a_minute() {
    let up = Upstream::start();
    let env = start_gw(&up, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 2500 tokens a minute; each call is metered at 1500. The first is
    // sent (0 counted), the second too (1500 < 2500) and passes the limit
    // by its own size (3000); the third is refused: 3000 reached 2500.
    let policy = json!({"files": files(d), "model_rate": {"tokens_per_minute": 2500}});
    env.sup
        .spawn(me(), exec("tokens", &looper(d, "t", 6), None, policy))
        .await
        .unwrap();
    let shown = wait_end(&env, "tokens").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let got = codes(d, "t");
    let statuses: Vec<u16> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429, 429], "{got:?}");
    assert_eq!(up.seen().len(), 2, "{:?}", up.seen());
    for (i, (_, retry)) in got.iter().enumerate().skip(2) {
        assert_refused(
            d,
            "t",
            i + 1,
            *retry,
            json!({"scope": "agent", "measure": "tokens_per_minute",
                   "field": "model_rate.tokens_per_minute", "value": 2500, "used": 3000}),
        );
    }
    // What brood metered is what it counted: the two calls' 3000 tokens.
    assert_eq!(shown["spend"]["own"]["tokens_in"], 2000, "{shown}");
    assert_eq!(shown["spend"]["own"]["tokens_out"], 1000, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_asking_a_higher_rate_than_its_parent_is_refused_and_one_asking_none_inherits() {
    let up = Upstream::start();
    let env = start_gw(&up, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    env.sup
        .spawn(
            me(),
            exec(
                "p",
                "sleep 60",
                None,
                json!({"model_rate": {"requests_per_minute": 2, "tokens_per_minute": 100000}}),
            ),
        )
        .await
        .unwrap();
    // More than the parent holds: refused at creation, naming the field
    // and both values, and nothing of it made.
    for (asked, says) in [
        (
            json!({"requests_per_minute": 3}),
            "model_rate.requests_per_minute: 3 is more than the parent's 2",
        ),
        (
            json!({"tokens_per_minute": 100001}),
            "model_rate.tokens_per_minute: 100001 is more than the parent's 100000",
        ),
    ] {
        let e = env
            .sup
            .spawn(
                me(),
                exec(
                    "greedy",
                    "true",
                    Some("p"),
                    json!({"files": files(d), "model_rate": asked}),
                ),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::PolicyExpansion, "{e}");
        assert!(e.message.contains(says), "{e}");
        assert!(env.sup.view().show(&name("greedy")).is_err());
    }
    assert!(up.seen().is_empty());
    // A child asking nothing of model_rate holds its parent's limits, and
    // is held to them: two calls sent, the rest refused.
    env.sup
        .spawn(
            me(),
            exec(
                "heir",
                &looper(d, "h", 5),
                Some("p"),
                json!({"files": files(d)}),
            ),
        )
        .await
        .unwrap();
    let shown = wait_end(&env, "heir").await;
    assert_eq!(
        shown["policy"]["model_rate"],
        json!({"requests_per_minute": 2, "tokens_per_minute": 100000}),
        "{shown}"
    );
    let statuses: Vec<u16> = codes(d, "h").iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429]);
    assert_eq!(up.seen().len(), 2, "{:?}", up.seen());
    assert_eq!(
        body(d, "h", 3)["error"]["limit"]["field"],
        "model_rate.requests_per_minute"
    );
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// A real `brood serve` whose configuration limits each tenant to four
/// calls a minute: one agent makes three calls, all sent; another agent of
/// the same tenant then gets one more through and is refused for the
/// rest, naming the tenant's limit, though its own policy has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_limit_holds_across_two_of_its_agents() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        root.join("config.toml"),
        format!(
            "[quotas.models]\nrequests_per_minute = 4\n\n\
             [models.openai]\nbase_url = \"{}\"\n\n\
             [models.prices]\n\"m-1\" = {{ input = 1, output = 2 }}\n",
            up.base_url
        ),
    )
    .unwrap();
    let _d = serve_daemon_with(&root, None, &[]);
    for tag in ["a", "b"] {
        let o = brood(
            &root,
            &[
                "spawn",
                "--name",
                tag,
                "--protocol",
                "exec",
                "--",
                "/bin/sh",
                "-c",
                &looper(&out, tag, 3),
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let o = brood(&root, &["wait", tag, "--timeout", "60"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let statuses = |tag| {
        codes(&out, tag)
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<u16>>()
    };
    assert_eq!(statuses("a"), vec![200, 200, 200]);
    assert_eq!(statuses("b"), vec![200, 429, 429]);
    assert_eq!(up.seen().len(), 4, "{:?}", up.seen());
    for (i, (_, retry)) in codes(&out, "b").into_iter().enumerate().skip(1) {
        assert_refused(
            &out,
            "b",
            i + 1,
            retry,
            json!({"scope": "tenant", "measure": "requests_per_minute",
                   "field": "quotas.models.requests_per_minute", "value": 4, "used": 4}),
        );
    }
    // The agent's own policy holds no limit: the tenant's is what refused.
    let o = brood(&root, &["show", "b", "--json"]);
    let shown: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert!(shown["policy"].is_object(), "{}", text(&o));
    assert!(shown["policy"].get("model_rate").is_none(), "{shown}");
}

/// The tenant's tokens a minute: one agent's call (1500 tokens metered)
/// leaves the next agent one call before the window's tokens reach 2000;
/// its next calls are refused naming the tenant's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_tokens_a_minute_hold_across_two_of_its_agents() {
    let up = Upstream::start();
    let env = start_gw(&up, |cfg| {
        cfg.quotas.models.tokens_per_minute = Some(2000);
    });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (n, tag, calls) in [("first", "f", 1), ("second", "s", 3)] {
        env.sup
            .spawn(
                me(),
                exec(n, &looper(d, tag, calls), None, json!({"files": files(d)})),
            )
            .await
            .unwrap();
        let shown = wait_end(&env, n).await;
        assert_eq!(shown["status"], "completed", "{shown}");
    }
    let statuses = |tag| codes(d, tag).iter().map(|(s, _)| *s).collect::<Vec<u16>>();
    assert_eq!(statuses("f"), vec![200]);
    assert_eq!(statuses("s"), vec![200, 429, 429]);
    assert_eq!(up.seen().len(), 2, "{:?}", up.seen());
    for (i, (_, retry)) in codes(d, "s").into_iter().enumerate().skip(1) {
        assert_refused(
            d,
            "s",
            i + 1,
            retry,
            json!({"scope": "tenant", "measure": "tokens_per_minute",
                   "field": "quotas.models.tokens_per_minute", "value": 2000, "used": 3000}),
        );
    }
    // Each refusal is in the second agent's log.
    let refused: Vec<Value> = calls_of(&env, "second")
        .into_iter()
        .filter(|c| c["outcome"] == "refused")
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused.iter().all(|c| c["status"] == 429
            && c["detail"]
                .as_str()
                .unwrap()
                .contains("quotas.models.tokens_per_minute = 2000")),
        "{refused:?}"
    );
}
