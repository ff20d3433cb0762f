//! Model providers: what the loop asks of a model (the conversation, the
//! tools it may call) and what it gets back (text, tool calls, usage),
//! streamed. `openai` speaks OpenAI-compatible chat completions to any base
//! URL; `script` replays turns from a file, offline and deterministic.

pub mod openai;
pub mod script;

use serde_json::Value;

use crate::io::CancelFlag;

/// A tool offered to the model: its name, what it does, its JSON Schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub parameters: Value,
}

/// A call the model asked for; `arguments` is the JSON text the model wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of the conversation, in chat-completions terms.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    System(String),
    User(String),
    Assistant { text: String, calls: Vec<ToolCall> },
    Tool { call_id: String, content: String },
}

/// Tokens one call used, when the provider said.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

/// What one model call gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    pub text: String,
    pub calls: Vec<ToolCall>,
    /// `None` when the provider did not report usage.
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// A cancel arrived mid-call; what was streamed so far is lost.
    Cancelled,
    /// The call failed for good (after the retries a failure allows).
    Failed(String),
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Cancelled => f.write_str("cancelled during a model call"),
            ProviderError::Failed(m) => f.write_str(m),
        }
    }
}

/// A model. `delta` is called with each piece of streamed text.
pub trait Provider {
    fn complete(
        &mut self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        delta: &mut dyn FnMut(&str),
        cancel: &CancelFlag,
    ) -> Result<Turn, ProviderError>;
}
