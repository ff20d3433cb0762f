//! What a model call used, read by brood from the provider's answer, never
//! from the agent: the usage of a whole body, or of a stream as it passes
//! (OpenAI's last chunk, Anthropic's `message_start` and `message_delta`,
//! the responses API's `response.completed`). When the provider gives no
//! usage, tokens are counted from the text (four bytes a token, the usual
//! rule of thumb for English and code), and the call is marked estimated.

use serde_json::Value;

/// The three endpoints the gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/messages`
    Messages,
}

impl Endpoint {
    /// The endpoint a request path names (`/v1/...`), if any.
    pub fn of_path(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            _ => None,
        }
    }

    pub fn kind(self) -> super::Kind {
        match self {
            Endpoint::Chat | Endpoint::Responses => super::Kind::OpenAi,
            Endpoint::Messages => super::Kind::Anthropic,
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
        }
    }
}

/// Tokens a text of `bytes` bytes is taken to hold when nobody counted.
pub fn tokens_of_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

/// What a call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Some of it was counted from text, not given by the provider.
    pub estimated: bool,
}

/// The input and output tokens of a `usage` object in any of the three
/// shapes: `prompt_tokens`/`completion_tokens` (chat completions),
/// `input_tokens`/`output_tokens` (responses, messages; Anthropic's cache
/// reads and writes are input too).
fn usage_object(u: &Value) -> (Option<u64>, Option<u64>) {
    if !u.is_object() {
        return (None, None);
    }
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    let input = match (n("prompt_tokens"), n("input_tokens")) {
        (Some(p), _) => Some(p),
        (None, Some(i)) => Some(
            i + n("cache_creation_input_tokens").unwrap_or(0)
                + n("cache_read_input_tokens").unwrap_or(0),
        ),
        (None, None) => None,
    };
    let output = n("completion_tokens").or_else(|| n("output_tokens"));
    (input, output)
}

/// The usage objects an answer or an event carries, wherever the three
/// protocols put them.
fn usages(v: &Value) -> impl Iterator<Item = &Value> {
    [
        v.get("usage"),
        v.get("message").and_then(|m| m.get("usage")),
        v.get("response").and_then(|m| m.get("usage")),
    ]
    .into_iter()
    .flatten()
}

/// The bytes of generated text an answer or a stream event carries (for
/// the count when no usage is given): message text, tool arguments,
/// reasoning, in each protocol's places.
fn text_bytes(v: &Value) -> u64 {
    let mut n = 0u64;
    let mut add = |x: Option<&Value>| {
        if let Some(s) = x.and_then(Value::as_str) {
            n += s.len() as u64;
        }
    };
    // Chat completions: whole choices and stream deltas.
    if let Some(cs) = v.get("choices").and_then(Value::as_array) {
        for c in cs {
            for part in [c.get("delta"), c.get("message")].into_iter().flatten() {
                add(part.get("content"));
                add(part.get("reasoning_content"));
                if let Some(calls) = part.get("tool_calls").and_then(Value::as_array) {
                    for call in calls {
                        add(call.get("function").and_then(|f| f.get("arguments")));
                    }
                }
            }
        }
    }
    // Responses: `response.output_text.delta` and the like carry `delta`
    // as a string; whole answers carry `output[].content[].text`.
    add(v.get("delta").filter(|d| d.is_string()));
    // Messages: `content_block_delta` events, whole `content` blocks.
    if let Some(d) = v.get("delta").filter(|d| d.is_object()) {
        add(d.get("text"));
        add(d.get("partial_json"));
        add(d.get("thinking"));
    }
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(
            v.get("output")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .flat_map(|o| {
                    o.get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                }),
        );
    let mut inputs = 0u64;
    for b in blocks {
        add(b.get("text"));
        add(b.get("thinking"));
        if let Some(input) = b.get("input").filter(|i| !i.is_null()) {
            inputs += input.to_string().len() as u64;
        }
    }
    n + inputs
}

/// Counts a call's usage, from the request's size (the input's estimate)
/// and whatever the answer says, whole or streamed.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    /// The request body's bytes, for the input's estimate.
    request_bytes: u64,
    input: Option<u64>,
    output: Option<u64>,
    text: u64,
    /// A stream's partial line.
    line: Vec<u8>,
}

/// The longest stream line kept while waiting for its end: past it, the
/// line is not read for usage (the bytes still reach the agent).
const MAX_LINE: usize = 4 << 20;

impl Meter {
    pub fn new(request_bytes: usize) -> Meter {
        Meter {
            request_bytes: request_bytes as u64,
            ..Meter::default()
        }
    }

    /// The input's estimate before anything is sent: the request's size.
    pub fn input_estimate(&self) -> u64 {
        tokens_of_bytes(self.request_bytes)
    }

    /// A whole (not streamed) answer's body.
    pub fn body(&mut self, body: &[u8]) {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            self.value(&v);
        }
    }

    fn value(&mut self, v: &Value) {
        for u in usages(v) {
            let (i, o) = usage_object(u);
            // Anthropic repeats and grows its counts (`message_delta`'s
            // output is cumulative): the largest seen is the call's.
            if let Some(i) = i {
                self.input = Some(self.input.map_or(i, |x| x.max(i)));
            }
            if let Some(o) = o {
                self.output = Some(self.output.map_or(o, |x| x.max(o)));
            }
        }
        self.text += text_bytes(v);
    }

    /// Bytes of a server-sent event stream, as they arrive: each complete
    /// `data:` line is read.
    pub fn stream(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            self.value(&v);
        }
    }

    /// What the call used so far: the provider's counts where it gave
    /// them, the estimates otherwise. The output is never below what the
    /// text already streamed holds, so a stream cut before its usage is
    /// still counted.
    pub fn usage(&self) -> Usage {
        let text = tokens_of_bytes(self.text);
        Usage {
            tokens_in: self.input.unwrap_or_else(|| self.input_estimate()),
            tokens_out: self.output.unwrap_or(text),
            estimated: self.input.is_none() || self.output.is_none(),
        }
    }

    /// The output so far for a budget's check mid-stream: the provider's
    /// count or the text's, whichever is more.
    pub fn usage_so_far(&self) -> Usage {
        let mut u = self.usage();
        u.tokens_out = u.tokens_out.max(tokens_of_bytes(self.text));
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_answers_give_their_usage_in_each_shape() {
        for (body, want) in [
            (
                r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7}}"#,
                (11, 7),
            ),
            (
                r#"{"output":[{"content":[{"text":"hi"}]}],"usage":{"input_tokens":5,"output_tokens":3}}"#,
                (5, 3),
            ),
            (
                r#"{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":4,"cache_read_input_tokens":6,"output_tokens":2}}"#,
                (10, 2),
            ),
        ] {
            let mut m = Meter::new(400);
            m.body(body.as_bytes());
            let u = m.usage();
            assert_eq!(
                (u.tokens_in, u.tokens_out, u.estimated),
                (want.0, want.1, false),
                "{body}"
            );
        }
    }

    #[test]
    fn without_usage_the_text_is_counted() {
        let mut m = Meter::new(41);
        m.body(br#"{"choices":[{"message":{"content":"0123456789abcdef"}}]}"#);
        assert_eq!(
            m.usage(),
            Usage {
                tokens_in: 11,
                tokens_out: 4,
                estimated: true
            }
        );
    }

    #[test]
    fn streams_are_read_across_arbitrary_splits() {
        let anthropic = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdefgh\"}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
        );
        let chat = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        for (text, want) in [(anthropic, (25, 15)), (chat, (9, 2))] {
            for split in [1, 3, 7, 1000] {
                let mut m = Meter::new(0);
                for piece in text.as_bytes().chunks(split) {
                    m.stream(piece);
                }
                let u = m.usage();
                assert_eq!((u.tokens_in, u.tokens_out), want, "split {split}");
                assert!(!u.estimated);
            }
        }
        // A stream cut before its usage: the text so far is counted.
        let mut m = Meter::new(8);
        m.stream(b"data: {\"choices\":[{\"delta\":{\"content\":\"abcdefghijkl\"}}]}\n");
        assert_eq!(
            m.usage_so_far(),
            Usage {
                tokens_in: 2,
                tokens_out: 3,
                estimated: true
            }
        );
    }

    #[test]
    fn paths_name_endpoints() {
        for e in [Endpoint::Chat, Endpoint::Responses, Endpoint::Messages] {
            assert_eq!(Endpoint::of_path(e.path()), Some(e));
        }
        assert_eq!(Endpoint::of_path("/v1/embeddings"), None);
        assert_eq!(Endpoint::Messages.kind(), super::super::Kind::Anthropic);
    }
}
