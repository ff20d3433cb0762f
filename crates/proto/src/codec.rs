//! Turning one line into a message and a message into one line, with the
//! protocol's failure rules: what is too long, not UTF-8, not JSON, not an
//! object, untyped or badly shaped, and how each is reported.
//!
//! The checks run in that order and stop at the first failure, so every bad
//! line gets exactly one, most basic, explanation.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::MAX_LINE;
use crate::messages::{FromAgent, ToAgent};

/// One decoded agent line: a message this version knows, or the name of a
/// `"type"` it does not (to be logged and ignored).
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    Msg(FromAgent),
    Unknown { type_name: String },
}

/// A line that breaks the protocol, with its line number (from 1; 0 when the
/// caller does not count lines).
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub line: u64,
    pub kind: LineErrorKind,
}

/// What was wrong with a line.
#[derive(Debug, Clone, PartialEq)]
pub enum LineErrorKind {
    /// Longer than [`MAX_LINE`] bytes; `len` is how many bytes were seen.
    TooLong {
        len: usize,
    },
    NotUtf8,
    /// Not JSON; the parser's explanation.
    NotJson(String),
    /// JSON, but not an object.
    NotObject,
    /// An object without a string `"type"`.
    MissingType,
    /// A known `"type"` whose fields have the wrong shape: the message type and
    /// what was wrong.
    BadShape(String),
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line != 0 {
            write!(f, "line {}: ", self.line)?;
        }
        match &self.kind {
            LineErrorKind::TooLong { .. } => write!(f, "longer than {MAX_LINE} bytes"),
            LineErrorKind::NotUtf8 => f.write_str("not valid UTF-8"),
            LineErrorKind::NotJson(why) => write!(f, "not JSON: {why}"),
            LineErrorKind::NotObject => f.write_str("not a JSON object"),
            LineErrorKind::MissingType => f.write_str("no string \"type\" field"),
            LineErrorKind::BadShape(why) => write!(f, "malformed {why}"),
        }
    }
}

impl std::error::Error for LineError {}

/// Decodes one line an agent wrote (with or without its trailing `'\n'`).
///
/// `Ok(None)` is a blank line (only whitespace), which the protocol ignores.
pub fn decode_line(line_no: u64, bytes: &[u8]) -> Result<Option<Decoded>, LineError> {
    let Some((type_name, value)) = parse_object(line_no, bytes)? else {
        return Ok(None);
    };
    match shape::<FromAgent>(line_no, &type_name, value)? {
        FromAgent::Unknown => Ok(Some(Decoded::Unknown { type_name })),
        msg => Ok(Some(Decoded::Msg(msg))),
    }
}

/// Decodes one line the supervisor wrote, for agents. Errors carry line 0.
///
/// A blank line decodes as [`ToAgent::Unknown`], which agents ignore like any
/// unknown message; so does a `"type"` this version does not know.
pub fn decode_to_agent(line: &[u8]) -> Result<ToAgent, LineError> {
    match parse_object(0, line)? {
        None => Ok(ToAgent::Unknown),
        Some((type_name, value)) => shape::<ToAgent>(0, &type_name, value),
    }
}

/// Encodes a message to an agent as one line, including the trailing `'\n'`.
///
/// The caller keeps messages under [`MAX_LINE`]; the agent would refuse a
/// longer line.
pub fn encode(msg: &ToAgent) -> Vec<u8> {
    encode_line(msg)
}

/// Encodes a message from an agent as one line, including the trailing `'\n'`.
pub fn encode_from_agent(msg: &FromAgent) -> Vec<u8> {
    encode_line(msg)
}

fn encode_line<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    if let Err(e) = serde_json::to_writer(&mut buf, msg) {
        // Serialising these types cannot fail: writing to a Vec does not fail,
        // every map has string keys and non-finite floats become null. Should
        // that ever change, the peer gets a line of an unknown type carrying the
        // reason, which it logs and ignores, rather than this process panicking.
        buf.clear();
        let why = Value::String(format!("brood-proto could not encode a message: {e}"));
        buf.extend_from_slice(format!(r#"{{"type":"encode-error","error":{why}}}"#).as_bytes());
    }
    buf.push(b'\n');
    buf
}

/// The checks every line goes through, whichever direction: length, UTF-8,
/// JSON, object, string `"type"`. Returns the type name and the object, or
/// `None` for a blank line.
fn parse_object(line_no: u64, bytes: &[u8]) -> Result<Option<(String, Value)>, LineError> {
    let err = |kind| LineError {
        line: line_no,
        kind,
    };
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if bytes.len() > MAX_LINE {
        return Err(err(LineErrorKind::TooLong { len: bytes.len() }));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| err(LineErrorKind::NotUtf8))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| err(LineErrorKind::NotJson(json_reason(&e))))?;
    let Value::Object(map) = &value else {
        return Err(err(LineErrorKind::NotObject));
    };
    let Some(Value::String(type_name)) = map.get("type") else {
        return Err(err(LineErrorKind::MissingType));
    };
    Ok(Some((type_name.clone(), value)))
}

/// Deserialises a checked object into a message type; a failure here is a
/// known type with the wrong fields.
fn shape<T: DeserializeOwned>(line_no: u64, type_name: &str, value: Value) -> Result<T, LineError> {
    serde_json::from_value(value).map_err(|e| LineError {
        line: line_no,
        kind: LineErrorKind::BadShape(format!("{type_name:?} message: {e}")),
    })
}

/// serde_json's message without its "at line 1 column N" suffix (a protocol line
/// is always line 1 of its own text), with the column kept.
fn json_reason(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match full.strip_suffix(&suffix) {
        Some(msg) => format!("{msg} at column {}", e.column()),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::*;
    use serde_json::json;

    fn decode(line: &str) -> Result<Option<Decoded>, LineError> {
        decode_line(3, line.as_bytes())
    }

    fn msg(line: &str) -> FromAgent {
        match decode(line) {
            Ok(Some(Decoded::Msg(m))) => m,
            other => panic!("{line}: expected a message, got {other:?}"),
        }
    }

    #[test]
    fn seed_done_line_parses() {
        let line = r#"{"type":"done","result":{"success":true,"response":"...","tokensIn":100,"tokensOut":50,"costUsd":0.001,"durationMs":800}}"#;
        assert_eq!(
            msg(line),
            FromAgent::Done {
                result: DoneResult {
                    success: true,
                    response: "...".into(),
                    tokens_in: 100,
                    tokens_out: 50,
                    cost_usd: 0.001,
                    duration_ms: 800,
                    refs: vec![],
                }
            }
        );
    }

    #[test]
    fn seed_init_line_parses() {
        let line = r#"{ "type": "init", "config": { "id": "...", "parentSessionId": "...", "instruction": "...", "subAgentType": "code", "config": {} }, "agentConfig": {} }"#;
        let ToAgent::Init {
            config,
            agent_config,
        } = decode_to_agent(line.as_bytes()).unwrap()
        else {
            panic!("not init")
        };
        assert_eq!(config.id, "...");
        assert_eq!(config.parent_session_id.as_deref(), Some("..."));
        assert_eq!(config.sub_agent_type.as_deref(), Some("code"));
        assert_eq!(config.instruction, "...");
        assert!(config.history.is_empty());
        assert_eq!(agent_config, json!({}));
    }

    #[test]
    fn minimal_init_and_full_init_parse() {
        assert_eq!(
            decode_to_agent(br#"{"type":"init","config":{}}"#).unwrap(),
            ToAgent::Init {
                config: InitConfig {
                    capabilities: json!({}),
                    config: json!({}),
                    ..InitConfig::default()
                },
                agent_config: Value::Null,
            }
        );
        let full = json!({"type":"init","config":{
            "id":"r1","name":"a","run":"r1","parentSessionId":"p","sessionId":"s",
            "instruction":"do it","subAgentType":"code","customer":"c",
            "handoff":{"dir":"/d","refs":[{"path":"x","summary":"y"}],"output":"text"},
            "capabilities":{"tools":["create"]},"config":{"model":"m"},
            "history":[{"role":"user","content":"hi"}]},"agentConfig":{"k":1}});
        let ToAgent::Init { config, .. } = decode_to_agent(full.to_string().as_bytes()).unwrap()
        else {
            panic!("not init")
        };
        assert_eq!(config.session_id, "s");
        assert_eq!(config.handoff.dir, "/d");
        assert_eq!(config.handoff.output, Some(json!("text")));
        assert_eq!(
            config.history,
            vec![HistoryMessage {
                role: "user".into(),
                content: "hi".into()
            }]
        );
    }

    #[test]
    fn every_from_agent_message_round_trips() {
        let all = vec![
            FromAgent::Ready,
            FromAgent::Chunk {
                delta: "hé\n\"x\"".into(),
            },
            FromAgent::Message {
                role: "assistant".into(),
                content: "hi".into(),
            },
            FromAgent::Usage {
                tokens_in: 1,
                tokens_out: 2,
                cost_usd: 0.5,
            },
            FromAgent::Status {
                status: "blocked".into(),
                reason: Some("input".into()),
            },
            FromAgent::Status {
                status: "running".into(),
                reason: None,
            },
            FromAgent::Request {
                id: 7,
                op: "spawn".into(),
                args: json!({"argv":["x"]}),
            },
            FromAgent::Done {
                result: DoneResult {
                    response: "r".into(),
                    refs: vec![json!({"path":"p","summary":"s"})],
                    ..DoneResult::default()
                },
            },
            FromAgent::Error {
                error: "boom".into(),
            },
            FromAgent::Pong,
        ];
        for m in all {
            let line = encode_from_agent(&m);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "{m:?}");
            assert_eq!(
                decode_line(1, &line),
                Ok(Some(Decoded::Msg(m.clone()))),
                "{m:?}"
            );
        }
    }

    #[test]
    fn every_to_agent_message_round_trips() {
        let all = vec![
            ToAgent::Init {
                config: InitConfig {
                    name: "a".into(),
                    parent_session_id: Some("p".into()),
                    history: vec![HistoryMessage {
                        role: "user".into(),
                        content: "x".into(),
                    }],
                    capabilities: json!({}),
                    config: json!({"model":"m"}),
                    ..InitConfig::default()
                },
                agent_config: json!({"a":1}),
            },
            ToAgent::Input {
                id: "i".into(),
                from: "user".into(),
                text: "hello".into(),
            },
            ToAgent::Reply(Reply::ok(3, json!({"name":"c"}))),
            ToAgent::Reply(Reply::err(
                4,
                ErrorBody {
                    code: "QuotaFanout".into(),
                    reason: "quota".into(),
                    message: "too many".into(),
                },
            )),
            ToAgent::Child {
                child: "c".into(),
                event: json!({"status":"completed"}),
            },
            ToAgent::Cancel {
                reason: "user".into(),
            },
            ToAgent::Ping,
        ];
        for m in all {
            let line = encode(&m);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(decode_to_agent(&line), Ok(m.clone()), "{m:?}");
        }
    }

    #[test]
    fn reply_wire_shape() {
        let ok = encode(&ToAgent::Reply(Reply::ok(1, json!({"a":1}))));
        assert_eq!(
            ok,
            b"{\"type\":\"reply\",\"re\":1,\"ok\":true,\"result\":{\"a\":1}}\n"
        );
        let err = Reply::err(
            2,
            ErrorBody {
                code: "C".into(),
                reason: "r".into(),
                message: "m".into(),
            },
        );
        assert_eq!(
            serde_json::to_value(ToAgent::Reply(err.clone())).unwrap(),
            json!({"type":"reply","re":2,"ok":false,"error":{"code":"C","reason":"r","message":"m"}})
        );
        assert_eq!(err.into_result().unwrap_err().code, "C");
        let bare = decode_to_agent(br#"{"type":"reply","re":5,"ok":false}"#).unwrap();
        let ToAgent::Reply(bare) = bare else {
            panic!("not a reply")
        };
        assert_eq!(bare.into_result().unwrap_err().code, "EIO");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert_eq!(msg(r#"{"type":"ready","extra":1}"#), FromAgent::Ready);
        assert_eq!(
            msg(r#"{"type":"chunk","delta":"d","seq":4,"more":{"x":[]}}"#),
            FromAgent::Chunk { delta: "d".into() }
        );
        assert_eq!(
            decode_to_agent(br#"{"type":"ping","at":1}"#),
            Ok(ToAgent::Ping)
        );
    }

    #[test]
    fn done_fields_default_and_floats_are_accepted() {
        assert_eq!(
            msg(r#"{"type":"done"}"#),
            FromAgent::Done {
                result: DoneResult::default()
            }
        );
        let FromAgent::Done { result } =
            msg(r#"{"type":"done","result":{"durationMs":800.6,"tokensIn":null,"x":1}}"#)
        else {
            panic!("not done")
        };
        assert!(result.success);
        assert_eq!(result.duration_ms, 801);
        assert_eq!(result.tokens_in, 0);
        let e = decode(r#"{"type":"done","result":{"tokensIn":-1}}"#).unwrap_err();
        assert!(matches!(e.kind, LineErrorKind::BadShape(_)), "{e}");
    }

    #[test]
    fn unknown_type_is_reported_with_its_name() {
        assert_eq!(
            decode(r#"{"type":"whatever","x":1}"#),
            Ok(Some(Decoded::Unknown {
                type_name: "whatever".into()
            }))
        );
        assert_eq!(
            decode_to_agent(br#"{"type":"future","x":{"y":1}}"#),
            Ok(ToAgent::Unknown)
        );
    }

    #[test]
    fn blank_lines_are_ignored() {
        assert_eq!(decode(""), Ok(None));
        assert_eq!(decode("\n"), Ok(None));
        assert_eq!(decode("  \t \r\n"), Ok(None));
        assert_eq!(decode_to_agent(b"\n"), Ok(ToAgent::Unknown));
    }

    #[test]
    fn failures_are_classified_and_named() {
        let e = decode("this is not json").unwrap_err();
        assert!(matches!(e.kind, LineErrorKind::NotJson(_)));
        let e = decode("hello").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: not JSON: expected value at column 1"
        );

        let e = decode_line(2, b"{\"type\":\"chunk\",\"delta\":\"\xff\xfe\"}\n").unwrap_err();
        assert_eq!(e.kind, LineErrorKind::NotUtf8);
        assert_eq!(e.to_string(), "line 2: not valid UTF-8");

        let e = decode("[1,2]").unwrap_err();
        assert_eq!(e.kind, LineErrorKind::NotObject);
        assert_eq!(e.to_string(), "line 3: not a JSON object");

        for bad in [r#"{"x":1}"#, r#"{"type":5}"#, r#"{"type":null}"#] {
            assert_eq!(
                decode(bad).unwrap_err().kind,
                LineErrorKind::MissingType,
                "{bad}"
            );
        }

        let e = decode(r#"{"type":"request","id":"one","op":"spawn"}"#).unwrap_err();
        assert!(matches!(e.kind, LineErrorKind::BadShape(_)));
        assert!(
            e.to_string()
                .starts_with("line 3: malformed \"request\" message: "),
            "{e}"
        );

        let e = decode(r#"{"type":"chunk"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `delta`"), "{e}");

        let e = decode(r#"{"type":"ready"} {"type":"ready"}"#).unwrap_err();
        assert!(matches!(e.kind, LineErrorKind::NotJson(_)), "{e}");

        let e = decode_to_agent(b"nope").unwrap_err();
        assert_eq!(e.to_string(), "not JSON: expected ident at column 2");
    }

    #[test]
    fn line_limit_is_exact() {
        let mut at = br#"{"type":"chunk","delta":""#.to_vec();
        let tail = br#""}"#;
        at.resize(MAX_LINE - tail.len(), b'a');
        at.extend_from_slice(tail);
        assert_eq!(at.len(), MAX_LINE);
        assert!(matches!(decode_line(1, &at), Ok(Some(Decoded::Msg(_)))));
        let mut with_newline = at.clone();
        with_newline.push(b'\n');
        assert!(matches!(
            decode_line(1, &with_newline),
            Ok(Some(Decoded::Msg(_)))
        ));

        at.insert(30, b'a');
        let e = decode_line(7, &at).unwrap_err();
        assert_eq!(e.kind, LineErrorKind::TooLong { len: MAX_LINE + 1 });
        assert_eq!(e.to_string(), "line 7: longer than 1048576 bytes");
    }
}
