//! The JSON Schema of a policy request (SPEC 5) as the API takes it (`policy`
//! of a creation, a job's workers, an MCP session): every field optional,
//! each as strict as `brood_proto::policy::from_value` and
//! `Policy::normalise` read it. What a schema cannot say is only in those
//! readers: two `files` rules for one path, a mount covering another, a
//! name both in `env` and in `secrets`, `bind` with `rbind`, an option
//! given twice.

use serde_json::{Value, json};

/// An agent name (SPEC 1), anchored.
pub const NAME: &str = r"^(?!.*\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$";

/// A string without control characters (Rust's `char::is_control`).
pub const NO_CONTROL: &str = r"^[^\u0000-\u001f\u007f-\u009f]*$";

/// An absolute path as `AbsPath` takes it: `/` first, no control
/// characters, no `.` or `..` component.
pub const ABS_PATH: &str = r"^(?!(.*/)?\.\.?(/.*)?$)/[^\u0000-\u001f\u007f-\u009f]*$";

/// A tool or model name, or a rule's object name: a word without
/// whitespace or control characters.
const WORD: &str = r"[^\s\u0000-\u001f\u007f-\u009f]+";

/// A tier of `path`: a word without `:`.
const TIER: &str = r"[^:\s\u0000-\u001f\u007f-\u009f]+";

/// A variable name of `env` or `secrets`: not empty, no `=`, whitespace or
/// control characters, not the runtime's own `BROOD_*` or `CTX_*`.
pub const VAR_NAME: &str = r"^(?!BROOD_|CTX_)[^=\s\u0000-\u001f\u007f-\u009f]+$";

/// A mount option word.
const MOUNT_OPTION: &str = "(bind|rbind|nosuid|nodev|noexec)";

/// The largest whole number a policy holds (the store's signed 64 bits).
const WHOLE_MAX: u64 = i64::MAX as u64;

/// Ten years, the longest `timeout_s`.
const TIMEOUT_MAX: u64 = 10 * 365 * 24 * 3600;

fn abs_path() -> Value {
    json!({"type": "string", "pattern": ABS_PATH, "maxLength": 4095})
}

/// A number of bytes: a whole number, or digits with a `K M G T` suffix
/// (powers of 1024); at least 1, within the store's 64 bits.
fn bytes(description: &str) -> Value {
    json!({
        "description": description,
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": WHOLE_MAX},
            {"type": "string", "pattern": "^(0*[1-9][0-9]{0,17}|0*[1-9][0-9]{0,5}[KMGTkmgt])$"},
        ]
    })
}

fn whole32(description: &str) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": u32::MAX, "description": description})
}

/// A user or group id: `(uid_t) -1` is not one.
fn id(description: &str) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": u32::MAX - 1, "description": description})
}

/// `schema`, or `null` (which the readers take as leaving the field out).
pub fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// The schema as JSON.
pub fn json() -> Value {
    let mut policy = fields();
    // `null` for a field is the same as leaving it out, in `resources` too.
    for at in [
        "/properties",
        "/properties/resources/anyOf/0/properties",
        "/properties/model_rate/anyOf/0/properties",
    ] {
        if let Some(props) = policy.pointer_mut(at).and_then(Value::as_object_mut) {
            for v in props.values_mut() {
                *v = nullable(v.take());
            }
        }
    }
    policy
}

/// An environment as a request gives it (`env` of a policy or a creation):
/// names as [`VAR_NAME`], values without NUL or newline.
pub fn env() -> Value {
    json!({
        "type": "object",
        "propertyNames": {"pattern": VAR_NAME},
        "additionalProperties": {"type": "string", "pattern": "^[^\\u0000\\n]*$"}
    })
}

/// Secret values as a request gives them (`secrets` of a creation, a
/// resume, an MCP session): names as [`VAR_NAME`], values without NUL.
pub fn secret_values() -> Value {
    json!({
        "type": "object",
        "propertyNames": {"pattern": VAR_NAME},
        "additionalProperties": {"type": "string", "pattern": "^[^\\u0000]*$"}
    })
}

/// A creation's `placement.labels`: names not empty, neither names nor
/// values with control characters.
pub fn labels() -> Value {
    json!({
        "type": "object",
        "propertyNames": {"pattern": r"^[^\u0000-\u001f\u007f-\u009f]+$"},
        "additionalProperties": {"type": "string", "pattern": NO_CONTROL}
    })
}

fn fields() -> Value {
    let subject =
        r"(self|\*|agent:(?![A-Za-z0-9._+-]*\.(sock|d) )[A-Za-z0-9][A-Za-z0-9._+-]{0,63})";
    let rule = format!(
        "^allow {subject} ((tool|model):{WORD} use|(shared|session|mount):{WORD} (read|write)|agent:{WORD} (create|send|wait|close|resume|cancel)|network:{WORD} (connect|bind))$"
    );
    let mount_line = format!(
        r"^/[^\t\u0000-\u001f\u007f-\u009f]*\t/[^\t\u0000-\u001f\u007f-\u009f]*\t(ro|rw)\t(-|{MOUNT_OPTION}(,{MOUNT_OPTION}){{0,4}})$"
    );
    json!({
        "type": "object",
        "additionalProperties": false,
        "description": "A policy request (SPEC 5): any subset of the fields, the rest inherited from the parent; checked against the parent's at admission (more than it holds is refused with 403). `null` for a field is the same as leaving it out.",
        "properties": {
            "tools": {"type": "array", "items": {"type": "string", "pattern": format!("^{WORD}$")}, "description": "The tools it may use."},
            "models": {"type": "array", "items": {"type": "string", "pattern": format!("^{WORD}$")}, "description": "The models it may use."},
            "files": {
                "type": "array",
                "description": "File rules, one per path (the deepest decides).",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["path", "mode"],
                    "properties": {
                        "path": abs_path(),
                        "mode": {"type": "string", "enum": ["hidden", "ro", "rw"]},
                    }
                }
            },
            "mounts": {
                "type": "array",
                "description": "The mount table (with `iso: ns`): `source<TAB>target<TAB>ro|rw<TAB>options` lines (`-` for none) or objects; no target at or under an earlier one's.",
                "items": {
                    "oneOf": [
                        {"type": "string", "pattern": mount_line},
                        {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["source", "target", "mode"],
                            "properties": {
                                "source": abs_path(),
                                "target": abs_path(),
                                "mode": {"type": "string", "enum": ["ro", "rw"]},
                                "options": {"type": "array", "uniqueItems": true, "maxItems": 4, "items": {"type": "string", "enum": ["bind", "rbind", "nosuid", "nodev", "noexec"]}},
                            }
                        }
                    ]
                }
            },
            "network": {
                "description": "`none`, `all`, or the TCP ports it may connect to.",
                "oneOf": [
                    {"type": "string", "enum": ["none", "all"]},
                    {
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["connect"],
                        "properties": {"connect": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}}}
                    }
                ]
            },
            "cost_limit": {"type": "number", "minimum": 0, "description": "Dollars it and its subtree may spend."},
            "window": {"type": "integer", "minimum": 1, "maximum": WHOLE_MAX, "description": "Context window in tokens."},
            "depth_limit": whole32("How deep its subtree may grow."),
            "create_limit": whole32("How many agents it may create."),
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": TIMEOUT_MAX, "description": "Seconds a run may take (at most ten years)."},
            "resources": {
                "type": "object",
                "additionalProperties": false,
                "description": "cgroup limits.",
                "properties": {
                    "memory_max": bytes("Memory, bytes."),
                    "disk_max": bytes("Disk, bytes."),
                    "pids_max": {"type": "integer", "minimum": 1, "maximum": 1u64 << 22},
                    "cpu_weight": {"type": "integer", "minimum": 1, "maximum": 10000},
                }
            },
            "model_rate": {
                "type": "object",
                "additionalProperties": false,
                "description": "Limits on its model calls through brood's gateway, each over a fixed one-minute window of its own calls (docs/models.md \"Rate limits\"); a call past one is answered 429 with Retry-After. Each left out is inherited from the parent; a child's is at most its parent's.",
                "properties": {
                    "requests_per_minute": {"type": "integer", "minimum": 1, "maximum": WHOLE_MAX, "description": "Calls sent a minute."},
                    "tokens_per_minute": {"type": "integer", "minimum": 1, "maximum": WHOLE_MAX, "description": "Tokens (input and output, as brood metered them) a minute; a call is refused once the window's tokens reached it."},
                }
            },
            "uid": id("The user it runs as."),
            "gid": id("Its group."),
            "groups": {"type": "array", "items": id("A supplementary group.")},
            "env": env(),
            "secrets": {
                "type": "array",
                "description": "Names of variables whose values the caller gives apart from the policy (the request's `secrets`); none also in `env`.",
                "items": {"type": "string", "pattern": VAR_NAME}
            },
            "path": {
                "description": "The tiers of its PATH, each once: `a:b:c` (`\"\"` for none) or an array.",
                "oneOf": [
                    {"type": "string", "pattern": format!("^({TIER}(:{TIER})*)?$")},
                    {"type": "array", "uniqueItems": true, "items": {"type": "string", "pattern": format!("^{TIER}$")}}
                ]
            },
            "rules": {"type": "array", "items": {"type": "string", "pattern": rule}, "description": "`allow <subject> <class>:<name> <perm>` rules."},
            "on_restart": {"type": "string", "enum": ["cancel", "resume"], "description": "What a start after its supervisor died does with the agent: `cancel` (the default) ends it `cancelled (runtime_restart)`, `resume` starts it again as a new run with its history; a child may hold `resume` only when its parent does."},
        }
    })
}

/// The name of the schema in the document's `components/schemas`, where
/// the document adds [`json`] (utoipa's own types do not hold every keyword
/// it uses, `propertyNames` among them).
pub const SCHEMA_NAME: &str = "Policy";

/// A field holding a policy, or `null`.
pub fn field() -> Value {
    nullable(json!({"$ref": format!("#/components/schemas/{SCHEMA_NAME}")}))
}
