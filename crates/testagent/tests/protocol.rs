//! The test agent driven in process through `run_with`: fed protocol lines (all
//! at once, or interactively through pipes) and judged by the lines it writes.
//! These pin the behaviours the runtime's tests and the demo rely on.

use std::io::{BufRead, BufReader, Cursor, Write};
use std::path::PathBuf;
use std::thread;

use brood_proto::{
    Decoded, DoneResult, ErrorBody, FromAgent, HistoryMessage, InitConfig, Reply, ToAgent,
    decode_line, encode,
};
use serde_json::{Value, json};

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn init(name: &str, history: Vec<HistoryMessage>) -> ToAgent {
    ToAgent::Init {
        config: InitConfig {
            name: name.into(),
            history,
            ..InitConfig::default()
        },
        agent_config: Value::Null,
    }
}

fn decode_all(out: &[u8]) -> Vec<FromAgent> {
    out.split_inclusive(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| match decode_line(i as u64 + 1, line) {
            Ok(Some(Decoded::Msg(m))) => m,
            other => panic!("line {}: {other:?}", i + 1),
        })
        .collect()
}

/// Runs the agent on `input` (already complete, so stdin ends after it).
fn run_raw(self_argv: &[&str], args: &[&str], input: Vec<u8>) -> (i32, Vec<u8>) {
    let mut out = Vec::new();
    let code = brood_testagent::run_with(
        Cursor::new(input),
        &mut out,
        &strings(self_argv),
        &strings(args),
    );
    (code, out)
}

fn run_fed(args: &[&str], msgs: &[ToAgent]) -> (i32, Vec<FromAgent>) {
    let input: Vec<u8> = msgs.iter().flat_map(encode).collect();
    let (code, out) = run_raw(&["/bin/brood", "test-agent"], args, input);
    (code, decode_all(&out))
}

fn done(response: &str) -> FromAgent {
    FromAgent::Done {
        result: DoneResult {
            response: response.into(),
            ..DoneResult::default()
        },
    }
}

/// The last message, with the duration zeroed so results compare exactly.
fn last(msgs: &[FromAgent]) -> FromAgent {
    match msgs.last().cloned() {
        Some(FromAgent::Done { mut result }) => {
            result.duration_ms = 0;
            FromAgent::Done { result }
        }
        Some(m) => m,
        None => panic!("no output"),
    }
}

fn reply(re: u64, result: Value) -> ToAgent {
    ToAgent::Reply(Reply::ok(re, result))
}

#[test]
fn ready_after_init_then_done_ok() {
    let (code, out) = run_fed(&[], &[init("a", vec![])]);
    assert_eq!(code, 0);
    assert_eq!(out[0], FromAgent::Ready);
    assert_eq!(out.len(), 2);
    assert_eq!(last(&out), done("ok"));
}

#[test]
fn result_messages_and_usage() {
    let (code, out) = run_fed(
        &[
            "--result",
            "answer",
            "--message",
            "m1",
            "--message",
            "m2",
            "--usage",
            "10,20,0.25",
        ],
        &[init("a", vec![])],
    );
    assert_eq!(code, 0);
    assert_eq!(
        out[..4],
        [
            FromAgent::Ready,
            FromAgent::Message {
                role: "assistant".into(),
                content: "m1".into()
            },
            FromAgent::Message {
                role: "assistant".into(),
                content: "m2".into()
            },
            FromAgent::Usage {
                tokens_in: 10,
                tokens_out: 20,
                cost_usd: 0.25
            },
        ]
    );
    assert_eq!(
        last(&out),
        FromAgent::Done {
            result: DoneResult {
                response: "answer".into(),
                tokens_in: 10,
                tokens_out: 20,
                cost_usd: 0.25,
                ..DoneResult::default()
            }
        }
    );
}

#[test]
fn ping_is_answered_while_waiting_and_inputs_are_collected() {
    let input = |text: &str| ToAgent::Input {
        id: "i".into(),
        from: "user".into(),
        text: text.into(),
    };
    let (code, out) = run_fed(
        &["--inputs", "2", "--result", "got"],
        &[init("a", vec![]), input("one"), ToAgent::Ping, input("two")],
    );
    assert_eq!(code, 0);
    assert_eq!(out[..2], [FromAgent::Ready, FromAgent::Pong]);
    assert_eq!(last(&out), done("got\none\ntwo"));
}

#[test]
fn ping_is_answered_during_a_sleep_and_eof_does_not_stop_it() {
    let (code, out) = run_fed(&["--sleep-ms", "100"], &[init("a", vec![]), ToAgent::Ping]);
    assert_eq!(code, 0);
    assert_eq!(out[..2], [FromAgent::Ready, FromAgent::Pong]);
    assert!(matches!(&out[2], FromAgent::Done { result } if result.duration_ms >= 100));
}

#[test]
fn history_is_shown() {
    let history = vec![
        HistoryMessage {
            role: "user".into(),
            content: "first".into(),
        },
        HistoryMessage {
            role: "assistant".into(),
            content: "ok".into(),
        },
    ];
    let (_, out) = run_fed(&["--history"], &[init("a", history)]);
    assert_eq!(
        last(&out),
        done("ok\nhistory: 2 messages\nuser: first\nassistant: ok")
    );
}

#[test]
fn spawns_and_wait_with_prepared_replies() {
    let (code, out) = run_fed(
        &[
            "--spawn",
            r#"{"name":"a","argv":["x"]}"#,
            "--spawn-n",
            r#"1:{"name":"w","argv":["y"]}"#,
            "--wait",
        ],
        &[
            init("p", vec![]),
            reply(1, json!({"name":"a"})),
            ToAgent::Child {
                child: "a".into(),
                event: json!({"status":"running"}),
            },
            reply(2, json!({"name":"w-1"})),
            reply(
                3,
                json!({"agents":[
                    {"name":"a","status":"completed","result":"A"},
                    {"name":"w-1","status":"failed","result":null}]}),
            ),
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(
        out[1..4],
        [
            FromAgent::Request {
                id: 1,
                op: "spawn".into(),
                args: json!({"name":"a","argv":["x"]})
            },
            FromAgent::Request {
                id: 2,
                op: "spawn".into(),
                args: json!({"name":"w-1","argv":["y"]})
            },
            FromAgent::Request {
                id: 3,
                op: "wait".into(),
                args: json!({"names":["a","w-1"]})
            },
        ]
    );
    assert_eq!(last(&out), done("ok\na: completed: A\nw-1: failed: "));
}

#[test]
fn spawn_and_wait_interactively() {
    let (stdin_r, mut stdin_w) = std::io::pipe().unwrap();
    let (stdout_r, stdout_w) = std::io::pipe().unwrap();
    let agent = thread::spawn(move || {
        brood_testagent::run_with(
            stdin_r,
            stdout_w,
            &strings(&["brood", "test-agent"]),
            &strings(&[
                "--spawn",
                r#"{"argv":["x"],"task":"t"}"#,
                "--wait",
                "--result",
                "parent",
            ]),
        )
    });
    let mut lines = BufReader::new(stdout_r).lines();
    let mut next = move || -> FromAgent {
        let line = lines.next().unwrap().unwrap();
        match decode_line(0, line.as_bytes()).unwrap() {
            Some(Decoded::Msg(m)) => m,
            other => panic!("{other:?}"),
        }
    };
    let mut send = |m: ToAgent| stdin_w.write_all(&encode(&m)).unwrap();

    send(init("p", vec![]));
    assert_eq!(next(), FromAgent::Ready);
    let FromAgent::Request { id, op, args } = next() else {
        panic!("expected a spawn request")
    };
    assert_eq!(op, "spawn");
    assert_eq!(args, json!({"argv":["x"],"task":"t"}));
    send(ToAgent::Ping);
    assert_eq!(
        next(),
        FromAgent::Pong,
        "pings are answered while a reply is awaited"
    );
    send(reply(id, json!({"name":"child-1"})));
    let FromAgent::Request { id, op, args } = next() else {
        panic!("expected a wait request")
    };
    assert_eq!(op, "wait");
    assert_eq!(args, json!({"names":["child-1"]}));
    send(reply(
        id,
        json!({"agents":[{"name":"child-1","status":"completed","result":"hello"}],"timed_out":false}),
    ));
    let FromAgent::Done { result } = next() else {
        panic!("expected done")
    };
    assert_eq!(result.response, "parent\nchild-1: completed: hello");
    assert_eq!(agent.join().unwrap(), 0);
}

#[test]
fn refused_spawn_fails_unless_tolerated() {
    let refusal = ToAgent::Reply(Reply::err(
        1,
        ErrorBody {
            code: "QuotaFanout".into(),
            reason: "quota".into(),
            message: "fanout 8 reached".into(),
        },
    ));
    let spawn = r#"{"name":"a","argv":["x"]}"#;
    let (code, out) = run_fed(
        &["--spawn", spawn, "--exit", "3"],
        &[init("p", vec![]), refusal.clone()],
    );
    assert_eq!(code, 3);
    assert_eq!(
        last(&out),
        FromAgent::Error {
            error: "spawn refused: QuotaFanout (quota): fanout 8 reached".into()
        }
    );
    let (code, out) = run_fed(
        &["--spawn", spawn, "--tolerate-refusal"],
        &[init("p", vec![]), refusal],
    );
    assert_eq!(code, 0);
    assert_eq!(last(&out), done("ok"));
}

#[test]
fn cancel_ends_a_hanging_agent_unless_ignored() {
    let cancel = ToAgent::Cancel {
        reason: "user".into(),
    };
    let (code, out) = run_fed(
        &["--hang", "--exit", "9"],
        &[init("a", vec![]), cancel.clone()],
    );
    assert_eq!(code, 0);
    assert_eq!(
        last(&out),
        FromAgent::Error {
            error: "cancelled: user".into()
        }
    );
    let (code, out) = run_fed(
        &["--ignore-cancel", "--inputs", "1"],
        &[
            init("a", vec![]),
            cancel,
            ToAgent::Input {
                id: "1".into(),
                from: "u".into(),
                text: "still here".into(),
            },
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(last(&out), done("ok\nstill here"));
}

#[test]
fn stdin_closing_while_a_reply_is_awaited_exits_4() {
    let (code, out) = run_fed(&["--spawn", r#"{"argv":["x"]}"#], &[init("a", vec![])]);
    assert_eq!(code, 4);
    assert!(matches!(out.last(), Some(FromAgent::Request { .. })));
}

#[test]
fn not_the_protocol_exits_3() {
    assert_eq!(run_raw(&[], &[], b"hello\n".to_vec()), (3, vec![]));
    assert_eq!(run_raw(&[], &[], encode(&ToAgent::Ping)), (3, vec![]));
    assert_eq!(run_raw(&[], &[], vec![]), (3, vec![]));
}

#[test]
fn blank_lines_before_init_are_skipped() {
    let mut input = b"\n  \n".to_vec();
    input.extend(encode(&init("a", vec![])));
    let (code, out) = run_raw(&[], &[], input);
    assert_eq!(code, 0);
    assert_eq!(decode_all(&out)[0], FromAgent::Ready);
}

#[test]
fn error_exit_and_no_result() {
    let (code, out) = run_fed(&["--error", "boom", "--exit", "5"], &[init("a", vec![])]);
    assert_eq!(code, 5);
    assert_eq!(
        last(&out),
        FromAgent::Error {
            error: "boom".into()
        }
    );
    let (code, out) = run_fed(&["--no-result"], &[init("a", vec![])]);
    assert_eq!(code, 0);
    assert_eq!(out, vec![FromAgent::Ready]);
}

#[test]
fn malformed_lines_are_written_raw_and_the_agent_goes_on() {
    let input = encode(&init("a", vec![]));
    let cases: [(&str, Vec<u8>); 4] = [
        ("notjson", b"this is not json\n".to_vec()),
        (
            "utf8",
            b"{\"type\":\"chunk\",\"delta\":\"\xff\xfe\"}\n".to_vec(),
        ),
        ("unknown", b"{\"type\":\"whatever\",\"x\":1}\n".to_vec()),
        ("long", {
            let mut l = vec![b'a'; 2 << 20];
            l.push(b'\n');
            l
        }),
    ];
    for (kind, bad) in cases {
        let (code, out) = run_raw(&[], &["--malformed", kind], input.clone());
        assert_eq!(code, 0, "{kind}");
        let ready = b"{\"type\":\"ready\"}\n";
        assert!(out.starts_with(ready), "{kind}");
        assert_eq!(
            &out[ready.len()..ready.len() + bad.len()],
            bad.as_slice(),
            "{kind}"
        );
        let rest = decode_all(&out[ready.len() + bad.len()..]);
        assert!(
            matches!(rest.as_slice(), [FromAgent::Done { .. }]),
            "{kind}"
        );
    }
}

#[test]
fn flood_sends_exactly_the_bytes_asked_for() {
    let (code, out) = run_fed(&["--flood", "150000"], &[init("a", vec![])]);
    assert_eq!(code, 0);
    let sizes: Vec<usize> = out
        .iter()
        .filter_map(|m| match m {
            FromAgent::Chunk { delta } => Some(delta.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, vec![65536, 65536, 150000 - 2 * 65536]);
}

#[test]
fn report_pids_without_grandchildren_writes_own_pid() {
    let file = temp_path("pids-own");
    let (code, _) = run_fed(
        &["--report-pids", file.to_str().unwrap()],
        &[init("a", vec![])],
    );
    assert_eq!(code, 0);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\n", std::process::id())
    );
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn grandchildren_and_a_setsid_daemon_are_forked_and_reported() {
    let file = temp_path("pids-forks");
    let (code, _) = run_fed(
        &[
            "--grandchildren",
            "2",
            "--setsid-grandchild",
            "--report-pids",
            file.to_str().unwrap(),
        ],
        &[init("a", vec![])],
    );
    assert_eq!(code, 0);
    let pids: Vec<libc::pid_t> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    std::fs::remove_file(&file).unwrap();
    // Kill the forked processes however the assertions below turn out: they
    // hold this test binary's stdout open and would keep cargo's pipe alive.
    let _guard = KillOnDrop(pids.get(1..).unwrap_or_default().to_vec());
    assert_eq!(pids.len(), 4);
    assert_eq!(pids[0], std::process::id() as libc::pid_t);
    // SAFETY (all libc calls below): plain syscalls on pids this test created.
    let own_sid = unsafe { libc::getsid(0) };
    for &pid in &pids[1..] {
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "pid {pid} is alive");
    }
    assert_eq!(unsafe { libc::getsid(pids[1]) }, own_sid);
    assert_eq!(unsafe { libc::getsid(pids[2]) }, own_sid);
    let daemon_sid = unsafe { libc::getsid(pids[3]) };
    assert!(
        daemon_sid > 0 && daemon_sid != own_sid,
        "the daemon left the session"
    );
    assert_ne!(
        daemon_sid, pids[3],
        "the daemon is not its session's leader"
    );
    assert_ne!(unsafe { libc::getpgid(pids[3]) }, unsafe {
        libc::getpgid(0)
    });
}

/// SIGKILLs the given pids and reaps those that are this process's children.
struct KillOnDrop(Vec<libc::pid_t>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: signalling and reaping pids this test forked.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
        }
    }
}

#[test]
fn count_lines_in_process_and_by_fan_out() {
    let root = temp_path("tree");
    std::fs::create_dir_all(root.join("sub dir")).unwrap();
    std::fs::write(root.join("a.txt"), "1\n2\n").unwrap();
    std::fs::write(root.join("sub dir/x"), "1\n2\n3").unwrap();
    let r = root.to_str().unwrap();

    let (code, out) = run_fed(
        &["--count-lines", r, "--work-ms", "1"],
        &[init("a", vec![])],
    );
    assert_eq!(code, 0);
    let expected =
        format!("5 lines in {r}\n2\t{r}/a.txt\n3 lines in {r}/sub dir\n3\t{r}/sub dir/x");
    assert_eq!(last(&out), done(&expected));

    let (code, out) = run_fed(
        &["--count-lines", &format!("{r}/a.txt")],
        &[init("a", vec![])],
    );
    assert_eq!(code, 0);
    assert_eq!(last(&out), done(&format!("2\t{r}/a.txt")));

    // The fan-out, with the children's answers prepared as the runtime would
    // give them: the same lines as the in-process count.
    let (code, out) = run_fed(
        &["--count-lines", r, "--fanout", "--work-ms", "5"],
        &[
            init("root", vec![]),
            reply(1, json!({"name":"count-a.txt"})),
            reply(2, json!({"name":"count-sub_dir"})),
            reply(
                3,
                json!({"agents":[
                    {"name":"count-a.txt","status":"completed","result":format!("2\t{r}/a.txt")},
                    {"name":"count-sub_dir","status":"completed","result":format!("3 lines in {r}/sub dir\n3\t{r}/sub dir/x")}]}),
            ),
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(
        out[1],
        FromAgent::Message {
            role: "assistant".into(),
            content: format!("counting the lines of {r}")
        }
    );
    assert_eq!(
        out[2],
        FromAgent::Request {
            id: 1,
            op: "spawn".into(),
            args: json!({"name":"count-a.txt",
                "argv":["/bin/brood","test-agent","--count-lines",format!("{r}/a.txt"),"--work-ms","5"],
                "task":format!("count lines in {r}/a.txt")})
        }
    );
    assert_eq!(
        out[3],
        FromAgent::Request {
            id: 2,
            op: "spawn".into(),
            args: json!({"name":"count-sub_dir",
                "argv":["/bin/brood","test-agent","--count-lines",format!("{r}/sub dir"),"--fanout","--work-ms","5"],
                "task":format!("count lines in {r}/sub dir")})
        }
    );
    assert_eq!(
        out[4],
        FromAgent::Request {
            id: 3,
            op: "wait".into(),
            args: json!({"names":["count-a.txt","count-sub_dir"]})
        }
    );
    assert_eq!(last(&out), done(&expected));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn help_prints_usage() {
    let (code, out) = run_raw(&[], &["--help"], vec![]);
    assert_eq!(code, 0);
    assert!(
        String::from_utf8(out)
            .unwrap()
            .starts_with("usage: brood test-agent")
    );
}

fn temp_path(what: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("brood-testagent-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}
