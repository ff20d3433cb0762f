//! The tool calls a resumed run finds in its history (issue 29 "nothing
//! done twice"): the calls recorded as done (a result recorded after them)
//! and those a crash left in flight (recorded, no result).
//!
//! A call in flight was not recorded as done, so the resumed run runs it
//! before it asks the model anything: the conversation then holds a result
//! for every call, as a chat model requires. A call recorded as done is not
//! run again: while the resumed run's model asks, call after call, for
//! what the history records in the same order (a model replaying its plan),
//! each call with side effects is answered with its recorded result. The
//! first call that differs ends the replay, and from there on every call
//! runs. A call that only reads (`file_read`, `wait`, ...) is run again
//! even while replaying: it changes nothing, and its answer is today's.

use brood_proto::HistoryMessage;
use serde_json::Value;

/// Transcript roles beyond the chat's own: a call the model made and what it got.
pub const ROLE_CALL: &str = "tool_call";
pub const ROLE_RESULT: &str = "tool";

/// The tools that change nothing: run again even while replaying.
const READ_ONLY: [&str; 7] = [
    "file_read",
    "file_list",
    "file_tree",
    "file_info",
    "file_search",
    "web_search",
    "wait",
];

/// A call recorded without a result: left in flight by a crash.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

struct Done {
    name: String,
    arguments: Value,
    result: String,
}

/// The calls recorded as done, in order, and how far a replay has come.
pub struct Journal {
    done: Vec<Done>,
    next: usize,
    replaying: bool,
}

/// A call's arguments as a value, so that `{"a":1, "b":2}` and
/// `{"b": 2, "a": 1}` are the same call; text that is not JSON is kept as text.
fn args_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

impl Journal {
    /// The journal of `history`, and the calls of its last assistant turn
    /// that have no result (in flight at a crash), in the order made.
    pub fn read(history: &[HistoryMessage]) -> (Journal, Vec<InFlight>) {
        // Calls by id, in order, with their result once one is recorded.
        let mut calls: Vec<(InFlight, Option<String>)> = Vec::new();
        // Where the last assistant turn's calls begin: only they can be in
        // flight (an earlier call without a result was answered by the
        // model going on without it).
        let mut turn_start = 0;
        let mut last_was_call = false;
        for m in history {
            let v: Value = serde_json::from_str(&m.content).unwrap_or(Value::Null);
            match m.role.as_str() {
                ROLE_CALL => {
                    if !last_was_call {
                        turn_start = calls.len();
                    }
                    last_was_call = true;
                    calls.push((
                        InFlight {
                            id: v["id"].as_str().unwrap_or("call").to_owned(),
                            name: v["name"].as_str().unwrap_or("").to_owned(),
                            arguments: v["arguments"].as_str().unwrap_or("{}").to_owned(),
                        },
                        None,
                    ));
                }
                ROLE_RESULT => {
                    let id = v["id"].as_str().unwrap_or("call");
                    if let Some((_, r)) = calls
                        .iter_mut()
                        .rev()
                        .find(|(c, r)| c.id == id && r.is_none())
                    {
                        *r = Some(v["content"].as_str().unwrap_or("").to_owned());
                    }
                    last_was_call = false;
                }
                "assistant" => {
                    turn_start = calls.len();
                    last_was_call = false;
                }
                _ => last_was_call = false,
            }
        }
        let mut done = Vec::new();
        let mut in_flight = Vec::new();
        for (i, (c, r)) in calls.into_iter().enumerate() {
            match r {
                Some(result) => done.push(Done {
                    arguments: args_value(&c.arguments),
                    name: c.name,
                    result,
                }),
                None if i >= turn_start => in_flight.push(c),
                None => {}
            }
        }
        let replaying = !done.is_empty() || !in_flight.is_empty();
        (
            Journal {
                done,
                next: 0,
                replaying,
            },
            in_flight,
        )
    }

    /// A call in flight that has now run: it is done, in the journal's order.
    pub fn push(&mut self, name: &str, arguments: &str, result: &str) {
        self.done.push(Done {
            name: name.to_owned(),
            arguments: args_value(arguments),
            result: result.to_owned(),
        });
        self.replaying = true;
    }

    /// The recorded result for the model's call `name(arguments)` when it is
    /// the next call of the journal and changes something: it is not run
    /// again. `None`: run it (the replay is over, or the call only reads).
    pub fn replayed(&mut self, name: &str, arguments: &str) -> Option<String> {
        if !self.replaying {
            return None;
        }
        let Some(d) = self.done.get(self.next) else {
            self.replaying = false;
            return None;
        };
        if d.name != name || d.arguments != args_value(arguments) {
            self.replaying = false;
            return None;
        }
        self.next += 1;
        if READ_ONLY.contains(&name) {
            return None;
        }
        Some(d.result.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, Journal, ROLE_CALL, ROLE_RESULT};
    use brood_proto::HistoryMessage;
    use serde_json::json;

    fn m(role: &str, content: String) -> HistoryMessage {
        HistoryMessage {
            role: role.to_owned(),
            content,
        }
    }
    fn call(id: &str, name: &str, args: &str) -> HistoryMessage {
        m(
            ROLE_CALL,
            json!({"id": id, "name": name, "arguments": args}).to_string(),
        )
    }
    fn result(id: &str, content: &str) -> HistoryMessage {
        m(
            ROLE_RESULT,
            json!({"id": id, "name": "x", "content": content}).to_string(),
        )
    }

    fn history() -> Vec<HistoryMessage> {
        vec![
            m("user", "the task".into()),
            call("c1", "shell", r#"{"command":"echo a >> f"}"#),
            call("c2", "create", r#"{"task":"t","name":"kid"}"#),
            result("c1", "ok"),
            result("c2", "created kid"),
            call("c3", "wait", r#"{"names":["kid"]}"#),
            call("c4", "file_write", r#"{"path":"/w","content":"x"}"#),
        ]
    }

    #[test]
    fn the_last_turns_calls_without_a_result_are_in_flight() {
        let (_, in_flight) = Journal::read(&history());
        assert_eq!(
            in_flight,
            vec![
                InFlight {
                    id: "c3".into(),
                    name: "wait".into(),
                    arguments: r#"{"names":["kid"]}"#.into()
                },
                InFlight {
                    id: "c4".into(),
                    name: "file_write".into(),
                    arguments: r#"{"path":"/w","content":"x"}"#.into()
                },
            ]
        );
        // An earlier turn's call without a result is history, not in flight.
        let mut h = history();
        h.truncate(5);
        h.insert(1, call("c0", "shell", "{}"));
        h.insert(2, m("assistant", "then".into()));
        let (_, in_flight) = Journal::read(&h);
        assert!(in_flight.is_empty(), "{in_flight:?}");
    }

    #[test]
    fn a_replayed_plan_gets_the_recorded_results_of_what_changed_something() {
        let (mut j, in_flight) = Journal::read(&history());
        for c in &in_flight {
            j.push(&c.name, &c.arguments, "ran again");
        }
        // The same calls in the same order (arguments in another order):
        // each call with a side effect answered from the record, the wait
        // run again.
        assert_eq!(
            j.replayed("shell", r#"{"command":"echo a >> f"}"#),
            Some("ok".into())
        );
        assert_eq!(
            j.replayed("create", r#"{"name":"kid","task":"t"}"#),
            Some("created kid".into())
        );
        assert_eq!(j.replayed("wait", r#"{"names":["kid"]}"#), None);
        assert_eq!(
            j.replayed("file_write", r#"{"path":"/w","content":"x"}"#),
            Some("ran again".into())
        );
        // Past the journal: everything runs.
        assert_eq!(j.replayed("shell", r#"{"command":"echo a >> f"}"#), None);
    }

    #[test]
    fn the_first_call_that_differs_ends_the_replay() {
        let (mut j, _) = Journal::read(&history());
        assert_eq!(j.replayed("shell", r#"{"command":"echo b >> f"}"#), None);
        // Even a call that would have matched runs once the replay is over.
        assert_eq!(j.replayed("create", r#"{"task":"t","name":"kid"}"#), None);
        // A first run has nothing to replay.
        let (mut j, in_flight) = Journal::read(&[m("user", "task".into())]);
        assert!(in_flight.is_empty());
        assert_eq!(j.replayed("shell", "{}"), None);
    }
}
