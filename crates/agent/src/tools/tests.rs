//! The local tools on real files: each one's work, and each bad input
//! answered with an error that says what was wrong.

use serde_json::{Value, json};

use super::{MAX_RESULT, local};
use crate::io::CancelFlag;
use crate::settings::{ConfigFile, Layer, Settings, resolve};

fn settings() -> Settings {
    let req = Layer {
        provider: Some("script".into()),
        ..Layer::default()
    };
    let mut s = resolve(None, &req, &ConfigFile::default(), None).unwrap();
    s.shell_timeout_s = 2;
    s
}

fn call(name: &str, args: Value) -> String {
    local(name, &args, &settings(), &CancelFlag::default())
}

fn p(dir: &tempfile::TempDir, f: &str) -> String {
    dir.path().join(f).display().to_string()
}

#[test]
fn read_write_edit_patch_rename_delete() {
    let d = tempfile::tempdir().unwrap();
    let a = p(&d, "a.txt");
    assert!(
        call(
            "file_write",
            json!({"path": a, "content": "one\ntwo\ntwo\nthree\n"})
        )
        .starts_with("wrote 18 bytes")
    );
    assert_eq!(
        call("file_read", json!({"path": a, "offset": 2, "limit": 2})),
        "two\ntwo"
    );
    let e = call("file_edit", json!({"path": a, "old": "two", "new": "2"}));
    assert!(
        e.contains("occurs 2 times") && e.starts_with("error:"),
        "{e}"
    );
    assert!(
        call(
            "file_edit",
            json!({"path": a, "old": "two\nthree", "new": "2\n3"})
        )
        .starts_with("replaced 1")
    );
    let e = call(
        "file_edit",
        json!({"path": a, "old": "nowhere", "new": "x"}),
    );
    assert!(e.contains("does not occur"), "{e}");
    assert!(
        call(
            "file_edit",
            json!({"path": a, "old": "two", "new": "2", "all": true})
        )
        .starts_with("replaced 1")
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "one\n2\n2\n3\n");
    let patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1,4 +1,4 @@\n one\n-2\n+two\n 2\n 3\n";
    let r = call("file_patch", json!({"path": a, "patch": patch}));
    assert!(r.starts_with("patched"), "{r}");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "one\ntwo\n2\n3\n");
    let r = call("file_patch", json!({"path": a, "patch": patch}));
    assert!(r.contains("does not apply"), "{r}");
    let r = call("file_patch", json!({"path": a, "patch": "not a diff"}));
    assert!(r.starts_with("error:"), "{r}");
    let b = p(&d, "b.txt");
    assert!(call("file_rename", json!({"from": a, "to": b})).starts_with("renamed"));
    let info = call("file_info", json!({"path": b}));
    assert!(info.contains("file, 12 bytes"), "{info}");
    let r = call("file_delete", json!({"path": d.path()}));
    assert!(r.contains("is a directory"), "{r}");
    assert!(call("file_delete", json!({"path": b})).starts_with("deleted"));
    let r = call("file_read", json!({"path": b}));
    assert!(r.contains("No such file"), "{r}");
}

#[test]
fn bad_arguments_are_named() {
    let r = call("file_read", json!({}));
    assert_eq!(r, "error: file_read: missing argument \"path\"");
    let r = call("file_read", json!({"path": 5}));
    assert!(r.contains("must be a string"), "{r}");
    let r = call("file_read", json!({"path": "/etc/hostname", "offset": "x"}));
    assert!(r.contains("whole number"), "{r}");
    let r = call("file_search", json!({"pattern": "("}));
    assert!(r.contains("not a regular expression"), "{r}");
    let r = call("code_exec", json!({"language": "cobol", "code": "x"}));
    assert!(r.contains("no interpreter for \"cobol\""), "{r}");
    let r = call("web_search", json!({"query": "x"}));
    assert!(r.contains("no search endpoint"), "{r}");
}

#[test]
fn list_tree_and_search_honour_ignore_files() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("src")).unwrap();
    std::fs::create_dir_all(d.path().join("target")).unwrap();
    std::fs::write(d.path().join(".ignore"), "target/\n").unwrap();
    std::fs::write(
        d.path().join("src/main.rs"),
        "fn main() {\n    println!(\"needle\");\n}\n",
    )
    .unwrap();
    std::fs::write(d.path().join("src/notes.txt"), "a needle here too\n").unwrap();
    std::fs::write(d.path().join("target/junk.rs"), "needle\n").unwrap();
    let root = d.path().display().to_string();
    let l = call("file_list", json!({"path": root}));
    assert!(l.contains("src/") && l.contains("target/"), "{l}");
    let t = call("file_tree", json!({"path": root}));
    assert!(t.contains("main.rs") && !t.contains("junk.rs"), "{t}");
    let s = call("file_search", json!({"pattern": "need+le", "path": root}));
    assert!(
        s.contains("main.rs:2:") && s.contains("notes.txt:1:") && !s.contains("junk"),
        "{s}"
    );
    let s = call(
        "file_search",
        json!({"pattern": "needle", "path": root, "glob": "*.rs"}),
    );
    assert!(s.contains("main.rs") && !s.contains("notes.txt"), "{s}");
    let s = call("file_search", json!({"pattern": "haystack", "path": root}));
    assert!(s.starts_with("no match"), "{s}");
}

#[test]
fn shell_and_code_exec_report_status_output_and_timeouts() {
    let r = call(
        "shell",
        json!({"command": "echo out; echo err >&2; exit 3"}),
    );
    assert!(
        r.starts_with("exit status 3")
            && r.contains("--- stdout\nout")
            && r.contains("--- stderr\nerr"),
        "{r}"
    );
    let r = call(
        "code_exec",
        json!({"language": "sh", "code": "echo $((6 * 7))"}),
    );
    assert!(r.contains("42"), "{r}");
    let r = call(
        "code_exec",
        json!({"language": "python", "code": "print(sum(range(10)))"}),
    );
    assert!(r.contains("45"), "{r}");
    // Past its timeout, the whole group is killed, grandchildren included.
    let r = call(
        "shell",
        json!({"command": "sleep 30 & sleep 30", "timeout_s": 1}),
    );
    assert!(r.starts_with("killed: it ran past its 1 s timeout"), "{r}");
    // A process that left the group (setsid) and holds the pipes does not
    // keep the tool past its timeout (issue 24): the tool answers, says so,
    // and the test would hang here (its thread never answering) otherwise.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = call(
            "shell",
            json!({"command": "setsid sleep 600 & echo pid=$!; sleep 600", "timeout_s": 1}),
        );
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the shell tool hung on a setsid'd process holding its pipes");
    assert!(r.starts_with("killed: it ran past its 1 s timeout"), "{r}");
    assert!(r.contains("still holds its output open"), "{r}");
    let pid: i32 = r
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.trim().parse().ok())
        .expect("the background pid");
    // SAFETY: killing the sleep this test made escape.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Output beyond the cap is counted, not kept.
    let r = call(
        "shell",
        json!({"command": "head -c 100000 /dev/zero | tr '\\\\0' x"}),
    );
    assert!(
        r.contains("more bytes of stdout not kept") && r.len() <= MAX_RESULT + 200,
        "{}",
        r.len()
    );
}

/// `create` asks for a node by labels (in a cluster) when it says which:
/// the request carries them as the API's `placement`; labels that are not
/// strings are the model's mistake, answered as one.
#[test]
fn create_carries_its_placement_labels() {
    let s = settings();
    let (op, req) = super::brood::build(
        "create",
        &json!({"task": "t", "name": "kid", "placement": {"pool": "b"}}),
        &s,
    )
    .unwrap();
    assert_eq!(op, "spawn");
    assert_eq!(req["placement"], json!({"labels": {"pool": "b"}}));
    let (_, plain) = super::brood::build("create", &json!({"task": "t"}), &s).unwrap();
    assert!(plain.get("placement").is_none(), "{plain}");
    let e = super::brood::build(
        "create",
        &json!({"task": "t", "placement": {"pool": 2}}),
        &s,
    )
    .unwrap_err();
    assert!(e.contains("placement"), "{e}");
}
