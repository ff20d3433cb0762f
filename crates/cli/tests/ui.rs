//! The web UI (docs/ui.md) in a real browser: the distribution's headless
//! Chromium, driven through its chromedriver by Selenium
//! (`tests/browser/driver.py`, all installed by `.ci/setup`), against a real
//! `brood serve --listen`. The tree appears and follows a child started
//! through the API without a reload; a cancel from the agent's page, its
//! confirmation accepted, cancels the subtree and its processes; a page
//! without the token is refused; a mutation carrying the cookie but not the
//! cross-site protection is refused, from the page and from another site's
//! form; a logout from the page ends the session, and the cookie copied
//! before it is refused; sessions end when idle and when old. And the main
//! pages' screenshots, taken afresh.
//!
//! Missing Chromium, chromedriver or Selenium is a failure naming what is
//! missing, never a skip.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod ui_support;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use ui_support::{Browser, Served, http, try_http};

fn pid_of(v: &Value) -> i32 {
    v["pid"].as_i64().unwrap_or_else(|| panic!("no pid: {v}")) as i32
}

/// Another site: a page on another port whose form posts, the moment it
/// loads, a cancel to the daemon (the browser carries the daemon's cookie
/// along, both being 127.0.0.1).
fn attacker_site(target: String) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().take(4) {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let page = format!(
                "<!doctype html><title>evil</title><form id=f method=POST action=\"{target}\"><input name=x value=1></form><script>document.getElementById('f').submit()</script>"
            );
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    port
}

#[test]
fn the_tree_is_live_a_cancel_from_the_page_stops_the_subtree_and_strangers_are_refused() {
    let s = Served::start();
    let hang = agent(&["--hang"]);
    s.spawn(json!({"name": "r", "argv": hang, "label": "a root <b>not bold</b>"}));

    // Without the token: refused, a page for a browser, JSON for the API.
    let a = http(s.port, "GET", "/ui", &[], b"");
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.body.contains("needs its token"), "{}", a.body);
    let a = http(s.port, "GET", "/api/ui/tree", &[], b"");
    assert_eq!(a.status, 401, "{}", a.body);
    let a = http(
        s.port,
        "GET",
        "/ui?token=0123456789abcdef0123456789abcdef",
        &[],
        b"",
    );
    assert_eq!(a.status, 401, "a wrong token: {}", a.body);

    let a = http(s.port, "GET", "/", &[], b"");
    assert_eq!(a.status, 401, "{}", a.body);
    let a = http(s.port, "GET", &format!("/?token={}", s.token), &[], b"");
    assert_eq!(a.status, 303, "{}", a.head);
    assert!(
        a.head.to_ascii_lowercase().contains("location: /ui\r\n"),
        "{}",
        a.head
    );

    // The first visit's cookie: HttpOnly, SameSite=Strict, the token gone.
    let a = http(s.port, "GET", &format!("/ui?token={}", s.token), &[], b"");
    assert_eq!(a.status, 303, "{}", a.head);
    let head = a.head.to_ascii_lowercase();
    assert!(head.contains("location: /ui\r\n"), "{}", a.head);
    let cookie_line = head
        .lines()
        .find(|l| l.starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {}", a.head))
        .to_owned();
    for part in ["httponly", "samesite=strict", "path=/"] {
        assert!(cookie_line.contains(part), "{cookie_line}");
    }
    assert!(
        !cookie_line.contains(&s.token),
        "the cookie is not the token"
    );
    let cookie = a
        .head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_owned();
    // The cookie reads; a mutation with it alone is refused, so is one from
    // another origin; with the header it acts (the bearer needs none).
    let a = http(s.port, "GET", "/ui", &[("Cookie", &cookie)], b"");
    assert_eq!(a.status, 200, "{}", a.body);
    let csp = a
        .head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-security-policy: ")
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no CSP: {}", a.head));
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    let a = http(s.port, "GET", "/api/ui/tree", &[("Cookie", &cookie)], b"");
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("\"name\":\"r\""), "{}", a.body);
    let a = http(
        s.port,
        "POST",
        "/api/agents/r/cancel",
        &[("Cookie", &cookie)],
        b"{}",
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("X-Brood-Csrf"), "{}", a.body);
    let a = http(
        s.port,
        "POST",
        "/api/agents/r/cancel",
        &[
            ("Cookie", &cookie),
            ("X-Brood-Csrf", "1"),
            ("Origin", "http://evil.example"),
        ],
        b"{}",
    );
    assert_eq!(a.status, 403, "{}", a.body);
    assert_eq!(s.agent("r")["status"], "running");

    // The browser: refused without the token.
    let mut b = Browser::start();
    b.get(&s.url("/ui"));
    b.wait("body", "needs its token");
    b.get(&s.url("/ui?token=wrong"));
    b.wait("body", "wrong");
    // With it: the address loses the token, the tree appears.
    let at = b.get(&s.url(&format!("/ui?token={}", s.token)));
    assert_eq!(at["url"], json!(s.url("/ui")), "the token left the address");
    b.wait("[data-row=r]", "r");
    // Agents' text is text: the label's markup is shown, not made.
    let label = b.wait("[data-row=r] .label", "<b>");
    assert_eq!(label, "a root <b>not bold</b>");
    assert_eq!(
        b.js("return document.querySelectorAll('#tree b').length"),
        json!(0)
    );
    assert_eq!(b.js("return document.cookie"), json!(""), "HttpOnly");

    // A child and a grandchild started through the API appear without a reload.
    b.js("window.__sameDocument = 42;");
    s.spawn(json!({"name": "c1", "parent": "r", "argv": hang}));
    b.wait("[data-row=c1]", "c1");
    b.wait("[data-row=r] .kids", "1");
    s.spawn(json!({"name": "c2", "parent": "c1", "argv": hang}));
    b.wait("[data-row=c2] [data-status]", "running");
    assert_eq!(b.js("return window.__sameDocument"), json!(42), "no reload");

    // The agent's page: its children, and a child's link back to its parent.
    b.view("#/agent/r");
    b.wait("#agent-name", "r");
    b.wait("#children", "c1");
    // What its policy says of a restart (issue 29): the default, cancel.
    let on_restart = b.js("const dt = [...document.querySelectorAll('dl.facts dt')]
           .find((d) => d.textContent === 'on restart');
         return dt ? dt.nextElementSibling.textContent : null;");
    assert_eq!(on_restart, json!("cancel"));
    b.click("#children a[data-agent=c1]");
    b.wait("#agent-name", "c1");
    b.wait("#parent-link", "r");
    b.wait("#children", "c2");

    // From the page, without the header: refused; and from another site's form.
    let r = b.cmd(json!({"op": "js_async", "script":
        "const done = arguments[arguments.length - 1]; fetch('/api/agents/c2/cancel', {method: 'POST', body: '{}'}).then(r => r.text().then(t => done([r.status, t])));"}));
    assert_eq!(r["value"][0], 403, "{r}");
    assert!(
        r["value"][1].as_str().unwrap().contains("X-Brood-Csrf"),
        "{r}"
    );
    let evil = attacker_site(s.url("/api/agents/c2/cancel"));
    b.get(&format!("http://127.0.0.1:{evil}/"));
    let refused = b.wait("body", "error");
    assert!(
        refused.contains("Forbidden") || refused.contains("Unauthorized"),
        "another site's form is refused: {refused}"
    );
    assert_eq!(
        s.agent("c2")["status"],
        "running",
        "the forged cancel did nothing"
    );

    // Cancel from r's page, the confirmation accepted: the whole subtree stops.
    let pids: Vec<i32> = ["r", "c1", "c2"]
        .iter()
        .map(|n| pid_of(&s.agent(n)))
        .collect();
    b.get(&s.url("/ui#/agent/r"));
    b.wait("#agent-name", "r");
    let asked = b.cmd(json!({"op": "click_confirm", "css": "#cancel", "accept": true}));
    assert!(
        asked["asked"].as_str().unwrap().contains("Cancel r"),
        "{asked}"
    );
    assert!(
        eventually(Duration::from_secs(40), || {
            ["r", "c1", "c2"]
                .iter()
                .all(|n| s.agent(n)["status"] == "cancelled")
        }),
        "the subtree is cancelled: {:?}",
        ["r", "c1", "c2"].map(|n| s.agent(n)["state"].clone())
    );
    assert!(
        eventually(Duration::from_secs(20), || pids.iter().all(|p| !alive(*p))),
        "every process of the subtree is gone: {pids:?}"
    );
    b.wait("#agent-head [data-status]", "cancelled");

    // Resume from the page: a new run of r, with the text as its message.
    b.cmd(json!({"op": "type", "css": "#input-text", "text": "go on"}));
    b.click("#resume");
    assert!(
        eventually(Duration::from_secs(40), || {
            let r = s.agent("r");
            r["status"] == "running" && r["runs"].as_array().is_some_and(|x| x.len() == 2)
        }),
        "r resumed: {}",
        s.agent("r")
    );
    b.wait("#agent-head [data-status]", "running");

    // Send input from the page: the transcript shows the answer as it comes.
    s.spawn(json!({"name": "chat", "argv": agent(&["--echo"])}));
    b.view("#/agent/chat");
    b.wait("#agent-name", "chat");
    let hostile = "<img src=x onerror=\"window.__owned=1\"> hello from the page";
    b.cmd(json!({"op": "type", "css": "#input-text", "text": hostile}));
    b.click("#send");
    b.wait("#transcript", &format!("echo: {hostile}"));
    // What an agent wrote is text on the page, never markup or script.
    assert_eq!(
        b.js("return [document.querySelectorAll('#main img').length, typeof window.__owned]"),
        json!([0, "undefined"])
    );
    b.wait("#agent-head [data-status]", "blocked");
    b.wait("#events", "agent.input");

    // An exec program sends no messages: its stdout (its result) and its
    // stderr are what the transcript's card shows of it (issue 25 item 8),
    // as text.
    s.spawn(json!({"name": "plain", "protocol": "exec",
        "argv": ["/bin/sh", "-c", "echo '<i>to stdout</i>'; echo '<b>to stderr</b>' >&2"]}));
    b.view("#/agent/plain");
    b.wait("#agent-name", "plain");
    b.wait("#agent-head [data-status]", "completed");
    b.view("#/agent/chat");
    b.view("#/agent/plain");
    b.wait("#stdout", "<i>to stdout</i>");
    b.wait("#stderr", "<b>to stderr</b>");
    assert_eq!(
        b.js("return document.querySelectorAll('#main i, #main b').length"),
        json!(0)
    );

    // Log out from the page: the session ends, the page asks for the token
    // again, and the cookie a thief copied from the profile before is refused.
    let stolen = b.cmd(json!({"op": "cookies"}))["cookies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("brood_ui"))
        })
        .map(|c| {
            format!(
                "{}={}",
                c["name"].as_str().unwrap(),
                c["value"].as_str().unwrap()
            )
        })
        .expect("the browser keeps the UI's cookie");
    assert_ne!(stolen, cookie, "each login is a session of its own");
    let a = http(s.port, "GET", "/api/ui/tree", &[("Cookie", &stolen)], b"");
    assert_eq!(a.status, 200, "{}", a.body);
    b.click("#logout");
    b.wait("body", "needs its token");
    let a = http(s.port, "GET", "/api/ui/tree", &[("Cookie", &stolen)], b"");
    assert_eq!(a.status, 401, "the stolen cookie after logout: {}", a.body);
    assert!(a.body.contains("session has ended"), "{}", a.body);
    b.get(&s.url("/ui"));
    b.wait("body", "needs its token");
    // Another session (the first visit's above) is not touched.
    let a = http(s.port, "GET", "/api/ui/tree", &[("Cookie", &cookie)], b"");
    assert_eq!(a.status, 200, "{}", a.body);
}

/// The cookie of `/ui?token=…`'s answer, as `name=value`.
fn login(s: &Served) -> String {
    let a = http(s.port, "GET", &format!("/ui?token={}", s.token), &[], b"");
    assert_eq!(a.status, 303, "{}", a.head);
    a.head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no cookie: {}", a.head))
        .to_owned()
}

/// The UI's sessions (issue 24): random, kept by the daemon, ended by a
/// logout (a cookie copied before it is refused after), by idleness and by
/// age, each refusal a 401 naming why.
#[test]
fn a_ui_session_ends_at_logout_when_idle_and_when_old() {
    let s = Served::start_with(&["--ui-session-idle", "3", "--ui-session-max", "8"]);
    let tree = |c: &str| http(s.port, "GET", "/api/ui/tree", &[("Cookie", c)], b"");

    // Random: two logins, two cookies, neither derived from the token.
    let (a, b) = (login(&s), login(&s));
    assert_ne!(a, b);
    assert!(!a.contains(&s.token) && !b.contains(&s.token));
    assert_eq!(tree(&a).status, 200);

    // Logout: a mutation like any other (the cross-site header needed),
    // then the cookie is refused, the other session untouched.
    let out = http(s.port, "POST", "/api/ui/logout", &[("Cookie", &a)], b"{}");
    assert_eq!(out.status, 403, "{}", out.body);
    assert_eq!(tree(&a).status, 200, "a refused logout ends nothing");
    let out = http(
        s.port,
        "POST",
        "/api/ui/logout",
        &[("Cookie", &a), ("X-Brood-Csrf", "1")],
        b"{}",
    );
    assert_eq!(out.status, 204, "{}", out.body);
    let clear = out.head.to_ascii_lowercase();
    assert!(
        clear.contains("max-age=0"),
        "the browser drops it: {}",
        out.head
    );
    let after = tree(&a);
    assert_eq!(after.status, 401, "{}", after.body);
    assert!(after.body.contains("session has ended"), "{}", after.body);
    assert_eq!(tree(&b).status, 200);

    // Idle: unused for longer than --ui-session-idle, it is gone.
    std::thread::sleep(Duration::from_millis(3500));
    let idle = tree(&b);
    assert_eq!(idle.status, 401, "{}", idle.body);
    assert!(idle.body.contains("3 s without a request"), "{}", idle.body);

    // Old: used every half second (never idle), it still ends at
    // --ui-session-max; before that it answered.
    let c = login(&s);
    let mut answered = 0;
    let ended = loop {
        let a = tree(&c);
        if a.status != 200 {
            break a;
        }
        answered += 1;
        assert!(answered < 60, "the session outlived --ui-session-max");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(ended.status, 401, "{}", ended.body);
    assert!(
        answered >= 2,
        "the session answered before it ended: {answered}"
    );
    assert!(ended.body.contains("8 s since it began"), "{}", ended.body);
}

/// The main pages, afresh: the tree, an agent's page, a job's page, into a
/// temporary directory, or into `BROOD_UI_SCREENSHOTS` when set (that is
/// how docs/ui/*.png are made: docs/ui.md).
#[test]
fn screenshots_of_the_main_pages() {
    let s = Served::start();
    let out_tmp = tempfile::tempdir().unwrap();
    let out = std::env::var_os("BROOD_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| out_tmp.path().to_path_buf());
    std::fs::create_dir_all(&out).unwrap();

    let lead = agent(&[
        "--message",
        "Splitting the review into three parts: the parser, the store and the docs.",
        "--usage",
        "1200,340,0.0123",
        "--hang",
    ]);
    s.spawn(json!({"name": "review-lead", "argv": lead, "label": "review the release"}));
    let done = |w: &str| {
        agent(&[
            "--artifact",
            "findings.md=# Findings\n\n- two small fixes\n",
            "--message",
            &format!("Looked at {w}."),
            "--usage",
            "5400,820,0.0391",
            "--result",
            &format!("{w}: no blocking issue; two small fixes suggested."),
        ])
    };
    s.spawn(json!({"name": "parser", "parent": "review-lead", "argv": done("the parser"), "task": "Review the parser for panics on bad input.",
        "policy": {"cost_limit": 0.5, "timeout_s": 600, "resources": {"memory_max": "256M", "pids_max": 64}}}));
    s.spawn(json!({"name": "store", "parent": "review-lead", "argv": agent(&["--usage", "800,120,0.0042", "--hang"]), "task": "Review the store's transactions."}));
    s.spawn(json!({"name": "store-tests", "parent": "store", "argv": agent(&["--hang"]), "task": "Run the store's conformance suite."}));
    s.spawn(json!({"name": "docs", "parent": "review-lead", "argv": ["sh", "-c", "exit 3"], "protocol": "exec", "task": "Proofread docs/."}));
    s.spawn(
        json!({"name": "nightly", "argv": agent(&["--usage", "5400,820,0.0391", "--result", "green"]), "label": "nightly checks"}),
    );
    // One that answered and waits for more: blocked.
    s.spawn(json!({"name": "ask-user", "parent": "review-lead", "argv": agent(&["--echo"]), "task": "Ask which release branch to review."}));
    s.ok(
        "POST",
        "/api/agents/ask-user/input",
        json!({"text": "release-2.4"}),
    );
    assert!(
        eventually(Duration::from_secs(40), || {
            s.agent("parser")["status"] == "completed" && s.agent("docs")["status"] == "failed"
        }),
        "parser {} and docs {} ended",
        s.agent("parser"),
        s.agent("docs")
    );

    // The listing's spend is the store's: each agent's own and subtree
    // sums match what its detail says.
    let listing = s.ok("GET", "/api/ui/tree", Value::Null);
    for row in listing["agents"].as_array().unwrap() {
        let name = row["name"].as_str().unwrap();
        let detail = s.agent(name);
        for k in ["own", "subtree"] {
            for f in ["tokens_in", "tokens_out"] {
                assert_eq!(row[k][f], detail["spend"][k][f], "{name} {k}.{f}");
            }
            let (a, b) = (
                row[k]["cost_usd"].as_f64().unwrap(),
                detail["spend"][k]["cost_usd"].as_f64().unwrap(),
            );
            assert!((a - b).abs() < 1e-9, "{name} {k}.cost_usd: {a} != {b}");
        }
    }
    // Only the trees at work: nightly's is finished.
    let live = s.ok("GET", "/api/ui/tree?live=true", Value::Null);
    let names: Vec<&str> = live["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(
        names.contains(&"store-tests") && !names.contains(&"nightly"),
        "{names:?}"
    );
    let lead = &listing["agents"][0];
    assert_eq!(
        (lead["name"].as_str(), lead["children"].as_u64()),
        (Some("review-lead"), Some(4))
    );
    assert_eq!(lead["subtree"]["tokens_in"], 1200 + 5400 + 800);

    // A job with retries: FAIL-ONCE items pass on their second attempt.
    let marks = tempfile::tempdir().unwrap();
    let worker = agent(&[
        "--job-worker",
        "--item-delay",
        "150",
        "--fail-first",
        marks.path().to_str().unwrap(),
        "--fail-marked-only",
    ]);
    let input: Vec<Value> = (1..=12)
        .map(|i| {
            let t = if i % 4 == 0 {
                format!("FAIL-ONCE file-{i}")
            } else {
                format!("file-{i}")
            };
            json!({"text": t})
        })
        .collect();
    s.ok(
        "POST",
        "/api/jobs",
        json!({"id": "summaries", "owner": "review-lead", "instruction": "Summarise {text}",
               "input": input, "worker": {"argv": worker}, "concurrency": 3, "max_attempts": 3}),
    );

    let mut b = Browser::start();
    b.get(&s.url(&format!("/ui?token={}", s.token)));
    b.wait("[data-row=store-tests]", "store-tests");
    b.wait("[data-row=docs] [data-status]", "failed");
    b.wait("[data-row=ask-user] [data-status]", "blocked");
    b.wait("[data-row=nightly] [data-status]", "completed");
    b.screenshot(&out.join("tree.png"));
    // "Only trees at work" hides the finished ones, and shows them again.
    b.click("#only-live");
    b.cmd(json!({"op": "wait_gone", "css": "[data-row=nightly]"}));
    b.wait("[data-row=store-tests]", "store-tests");
    b.click("#only-live");
    b.wait("[data-row=nightly]", "nightly");

    // The job's page follows its progress live: opened pending, started
    // through the API, completed without a reload.
    b.view("#/job/summaries");
    b.wait("#job-id", "summaries");
    b.wait("h1 [data-status]", "pending");
    b.js("window.__sameDocument = 7;");
    s.ok("POST", "/api/jobs/summaries/start", Value::Null);
    b.cmd(json!({"op": "wait", "css": "[data-count=completed] b", "text": "12", "timeout": 90}));
    b.wait("h1 [data-status]", "completed");
    assert_eq!(b.js("return window.__sameDocument"), json!(7), "no reload");
    assert_eq!(
        b.js("return document.querySelector('[data-item=\"4\"] [data-attempts]').textContent"),
        json!("2"),
        "a FAIL-ONCE item shows its two attempts"
    );
    // An item's attempts, unfolded: the failed one and the one that passed.
    b.click("[data-item=\"4\"] button.toggle-attempts");
    let attempts = b.wait("[data-attempts-of=\"4\"]", "attempt 2");
    assert!(
        attempts.contains("attempt 1")
            && attempts.contains("failed")
            && attempts.contains("completed"),
        "{attempts}"
    );
    b.screenshot(&out.join("job.png"));

    b.view("#/agent/parser");
    b.wait("#result", "no blocking issue");
    b.wait("#transcript", "Looked at the parser");
    b.wait("#limits", "pids_max");
    // The artifact it handed back downloads from its page, byte for byte.
    let got = b.cmd(json!({"op": "js_async", "script":
        "const done = arguments[arguments.length - 1]; const a = document.querySelector('a[data-artifact=\"findings.md\"]'); fetch(a.href).then(r => r.text().then(t => done([r.status, r.headers.get('content-disposition'), t])));"}));
    assert_eq!(
        got["value"],
        json!([
            200,
            "attachment; filename=\"findings.md\"",
            "# Findings\n\n- two small fixes\n"
        ])
    );
    b.screenshot(&out.join("agent.png"));

    // The timeline (issue 30): each agent's life from the records, its
    // end with its reason; the one waiting for input, waiting.
    b.view("#/timeline");
    b.wait("[data-tl=docs]", "exit_code");
    let mut segs = |name: &str, cls: &str| {
        b.js(&format!(
            "return document.querySelectorAll('[data-tl=\"{name}\"] .seg.{cls}').length"
        ))
    };
    assert_eq!(segs("docs", "end.failed"), json!(1));
    assert_eq!(segs("parser", "end.completed"), json!(1));
    assert_eq!(segs("parser", "running"), json!(1));
    assert_eq!(segs("ask-user", "waiting"), json!(1));
    assert_eq!(segs("store-tests", "running"), json!(1));
    assert_eq!(segs("store-tests", "end"), json!(0), "still running");
    b.screenshot(&out.join("timeline.png"));

    b.view("#/jobs");
    b.wait("#jobs", "summaries");
    for f in ["tree.png", "agent.png", "job.png", "timeline.png"] {
        assert!(out.join(f).exists(), "{f} was taken");
    }
}

/// A thousand agents: the tree page reads one compact listing and no
/// agent's detail, and shows every agent, the queued ones as queued.
#[test]
fn a_thousand_agents_are_one_listing_and_no_detail() {
    let s = Served::start();
    const N: usize = 1000;
    // Roots that each want a slot: the tenant's 16 run, the rest queue.
    let auth = format!("Bearer {}", s.token);
    for i in 0..N {
        let body =
            json!({"name": format!("bulk-{i:04}"), "argv": ["sleep", "600"], "protocol": "exec"})
                .to_string();
        let key = format!("bulk-{i:04}");
        let headers = [("Authorization", auth.as_str()), ("Idempotency-Key", &key)];
        // A thousand connections one after the other on a loaded machine: a
        // connection the kernel resets is retried under the same key (so it
        // is never admitted twice), and said.
        let mut a = try_http(s.port, "POST", "/api/agents", &headers, body.as_bytes());
        if let Err(e) = &a {
            eprintln!("POST /api/agents bulk-{i:04}: {e}; retried with its Idempotency-Key");
            a = try_http(s.port, "POST", "/api/agents", &headers, body.as_bytes());
        }
        let a = a.unwrap_or_else(|e| panic!("bulk-{i:04}: {e}"));
        assert_eq!(a.status, 201, "bulk-{i:04}: {}", a.body);
    }
    let t0 = std::time::Instant::now();
    let (status, listing) = s.api("GET", "/api/ui/tree", Value::Null);
    assert_eq!(status, 200);
    assert_eq!(listing["agents"].as_array().unwrap().len(), N);
    eprintln!("GET /api/ui/tree with {N} agents: {:?}", t0.elapsed());

    let mut b = Browser::start();
    b.get(&s.url(&format!("/ui?token={}", s.token)));
    b.wait("[data-row=bulk-0999]", "bulk-0999");
    assert_eq!(
        b.js("return document.querySelectorAll('#tree [data-row]').length"),
        json!(N)
    );
    let queued = b.wait("[data-count=queued] b", "");
    let running = b.wait("[data-count=running] b", "");
    assert_eq!(
        queued.parse::<usize>().unwrap() + running.parse::<usize>().unwrap(),
        N,
        "every agent is running or queued"
    );
    assert!(
        queued.parse::<usize>().unwrap() > 0,
        "queued agents show as such"
    );
    b.wait("[data-row=bulk-0999] [data-status]", "queued");
    // What the page asked for: the listing, never an agent's detail.
    let asked =
        b.js("return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)");
    let asked: Vec<&str> = asked
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(asked.contains(&"/api/ui/tree"), "{asked:?}");
    assert!(
        !asked.iter().any(|p| p.starts_with("/api/agents")),
        "the tree fetched an agent's detail: {asked:?}"
    );

    // The timeline of the thousand, from the same one listing: a running
    // agent has its running segment, a queued one its queued segment alone.
    b.view("#/timeline");
    b.wait("[data-tl=bulk-0999]", "bulk-0999");
    assert_eq!(
        b.js("return document.querySelectorAll('#timeline [data-tl]').length"),
        json!(N)
    );
    let first_running = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["status"] == "running")
        .and_then(|a| a["name"].as_str())
        .unwrap()
        .to_owned();
    let segs = |b: &mut Browser, name: &str, cls: &str| {
        b.js(&format!(
            "return document.querySelectorAll('[data-tl=\"{name}\"] .seg.{cls}').length"
        ))
    };
    assert_eq!(segs(&mut b, &first_running, "running"), json!(1));
    assert_eq!(segs(&mut b, "bulk-0999", "queued"), json!(1));
    assert_eq!(segs(&mut b, "bulk-0999", "running"), json!(0));
    let asked =
        b.js("return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)");
    assert!(
        !asked
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap_or("").starts_with("/api/agents")),
        "the timeline fetched an agent's detail: {asked}"
    );
}
