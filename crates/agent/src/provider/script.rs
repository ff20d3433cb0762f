//! The `script` provider: model turns replayed from a file, offline and
//! deterministic (docs/agent.md "The script format").
//!
//! ```json
//! {"agents": {"root": [TURN, ...], "explore": [TURN, ...]},
//!  "turns": [TURN, ...], "replay": false}
//! TURN = {"text": "...", "tool_calls": [{"name": "file_read", "arguments": {"path": "a.txt"}}],
//!         "usage": {"input": 120, "output": 30}, "delay_ms": 0}
//! ```
//!
//! An agent plays the turns listed under its name, else under its type,
//! else `turns`; the n-th model call of a conversation plays the n-th turn
//! (counting the assistant turns already in its history, so a resumed agent
//! goes on where it stopped). `text` is streamed in pieces; `delay_ms`
//! makes a turn slow (to cancel it mid-stream in a test). With
//! `"replay": true` every run plays from the first turn instead: a model
//! that replays its whole plan when resumed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::{ChatMessage, Provider, ProviderError, ToolCall, ToolSpec, Turn, Usage};
use crate::io::CancelFlag;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    #[serde(default)]
    agents: std::collections::BTreeMap<String, Vec<ScriptTurn>>,
    #[serde(default)]
    turns: Vec<ScriptTurn>,
    /// Every run plays from the first turn, whatever its history holds: a
    /// model that replays its whole plan when resumed (issue 29's tests).
    #[serde(default)]
    replay: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptTurn {
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    usage: Option<ScriptUsage>,
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptUsage {
    input: u64,
    output: u64,
}

pub struct Script {
    path: PathBuf,
    who: String,
    turns: Vec<ScriptTurn>,
    replay: bool,
    /// Turns played by this process (what `replay` counts).
    played: usize,
}

impl Script {
    /// The turns of agent `name` (of type `type_name`) in `path`.
    pub fn open(path: &Path, name: &str, type_name: &str) -> Result<Script, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the script {}: {e}", path.display()))?;
        let f: ScriptFile =
            serde_json::from_str(&text).map_err(|e| format!("script {}: {e}", path.display()))?;
        let (who, turns) = if let Some(t) = f.agents.get(name) {
            (name.to_owned(), t.clone())
        } else if let Some(t) = f.agents.get(type_name) {
            (type_name.to_owned(), t.clone())
        } else {
            ("turns".to_owned(), f.turns)
        };
        Ok(Script {
            path: path.to_owned(),
            who,
            turns,
            replay: f.replay,
            played: 0,
        })
    }
}

impl Provider for Script {
    fn complete(
        &mut self,
        messages: &[ChatMessage],
        _tools: &[ToolSpec],
        delta: &mut dyn FnMut(&str),
        cancel: &CancelFlag,
    ) -> Result<Turn, ProviderError> {
        let n = if self.replay {
            self.played
        } else {
            messages
                .iter()
                .filter(|m| matches!(m, ChatMessage::Assistant { .. }))
                .count()
        };
        let t = self.turns.get(n).ok_or_else(|| {
            ProviderError::Failed(format!(
                "the script {} has no turn {} for {} (it has {})",
                self.path.display(),
                n + 1,
                self.who,
                self.turns.len()
            ))
        })?;
        // Streamed in pieces, spread over `delay_ms`, checking for a cancel.
        let pieces: Vec<String> = {
            let chars: Vec<char> = t.text.chars().collect();
            chars.chunks(16).map(|c| c.iter().collect()).collect()
        };
        let start = Instant::now();
        let steps = pieces.len().max(1) as u32;
        for (i, p) in pieces.iter().enumerate() {
            let due = Duration::from_millis(t.delay_ms) * (i as u32) / steps;
            while start.elapsed() < due {
                if cancel.is_set() {
                    return Err(ProviderError::Cancelled);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if cancel.is_set() {
                return Err(ProviderError::Cancelled);
            }
            delta(p);
        }
        while start.elapsed() < Duration::from_millis(t.delay_ms) {
            if cancel.is_set() {
                return Err(ProviderError::Cancelled);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.played += 1;
        Ok(Turn {
            text: t.text.clone(),
            calls: t
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, c)| ToolCall {
                    id: format!("call_{}_{}", n + 1, i + 1),
                    name: c.name.clone(),
                    arguments: if c.arguments.is_null() {
                        "{}".to_owned()
                    } else {
                        c.arguments.to_string()
                    },
                })
                .collect(),
            usage: t.usage.map(|u| Usage {
                input: u.input,
                output: u.output,
            }),
        })
    }
}
