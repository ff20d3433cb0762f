//! The policy reader's tests: every field from JSON and from TOML, every
//! bad value refused naming its field, and `to_json` read back.

use super::{
    DOCUMENT, FIELDS, Network, Policy, PolicyRequest, from_value, hide_env, parse_json, parse_toml,
    shown, to_json,
};
use brood_core::policy::{
    AbsPath, FileRule, Mode, ModelRate, MountEntry, OnRestart, Resources, Rule, effective,
};
use std::collections::BTreeSet;

fn ap(s: &str) -> AbsPath {
    AbsPath::new("test", s).unwrap()
}

fn names(xs: &[&str]) -> BTreeSet<String> {
    xs.iter().map(|s| (*s).to_owned()).collect()
}

/// Every field, as the JSON test document gives it.
fn expected() -> PolicyRequest {
    PolicyRequest {
        tools: Some(names(&["file_read", "shell"])),
        files: Some(vec![
            FileRule {
                path: ap("/"),
                mode: Mode::Ro,
            },
            FileRule {
                path: ap("/secret"),
                mode: Mode::Hidden,
            },
            FileRule {
                path: ap("/work"),
                mode: Mode::Rw,
            },
        ]),
        mounts: Some(vec![
            MountEntry::parse_line("m", "/src\t/dst\tro\tbind,nosuid").unwrap(),
            MountEntry::parse_line("m", "/home\t/home\trw\trbind,nodev,noexec").unwrap(),
            MountEntry::parse_line("m", "/tmp\t/tmp\trw\t-").unwrap(),
        ]),
        network: Some(Network::Connect([443, 80].into())),
        cost_limit: Some(2.5),
        window: Some(128_000),
        depth_limit: Some(2),
        create_limit: Some(4),
        timeout_s: Some(600),
        resources: Resources {
            memory_max: Some(256 << 20),
            pids_max: Some(64),
            cpu_weight: Some(50),
            disk_max: Some(2 << 30),
        },
        model_rate: ModelRate {
            requests_per_minute: Some(60),
            tokens_per_minute: Some(200_000),
        },
        uid: Some(1000),
        gid: Some(1000),
        groups: Some([27, 1000].into()),
        env: Some(
            [("LANG", "C.UTF-8"), ("TOKEN", "x=y")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ),
        secrets: Some(names(&["OPENAI_API_KEY", "GH_TOKEN"])),
        models: Some(names(&["gpt-x", "local"])),
        path: Some(vec!["proj".into(), "user".into(), "sys".into()]),
        rules: Some(vec![
            Rule::parse("r", "allow agent:rev shared:notes read").unwrap(),
            Rule::parse("r", "allow self tool:shell use").unwrap(),
        ]),
        on_restart: Some(OnRestart::Resume),
    }
}

const JSON: &str = r#"{
    "tools": ["shell", "file_read"],
    "files": [{"path": "/work/", "mode": "rw"}, {"path": "/", "mode": "ro"},
              {"path": "//secret", "mode": "hidden"}],
    "mounts": ["/src\t/dst\tro\tbind,nosuid",
               {"source": "/home", "target": "/home", "mode": "rw",
                "options": ["rbind", "nodev", "noexec"]},
               {"source": "/tmp", "target": "/tmp", "mode": "rw"}],
    "network": {"connect": [443, 80]},
    "cost_limit": 2.5,
    "window": 128000,
    "depth_limit": 2,
    "create_limit": 4,
    "timeout_s": 600,
    "resources": {"memory_max": "256M", "pids_max": 64, "cpu_weight": 50, "disk_max": "2G"},
    "model_rate": {"requests_per_minute": 60, "tokens_per_minute": 200000},
    "uid": 1000,
    "gid": 1000,
    "groups": [1000, 27],
    "env": {"LANG": "C.UTF-8", "TOKEN": "x=y"},
    "secrets": ["OPENAI_API_KEY", "GH_TOKEN"],
    "models": ["local", "gpt-x"],
    "path": "proj:user:sys",
    "rules": ["allow self tool:shell use", "allow agent:rev shared:notes read"],
    "on_restart": "resume"
}"#;

const TOML: &str = r#"
    tools = ["shell", "file_read"]
    files = [
        { path = "/work/", mode = "rw" },
        { path = "/", mode = "ro" },
        { path = "//secret", mode = "hidden" },
    ]
    mounts = [
        "/src	/dst	ro	bind,nosuid",
        { source = "/home", target = "/home", mode = "rw", options = ["rbind", "nodev", "noexec"] },
        { source = "/tmp", target = "/tmp", mode = "rw" },
    ]
    network = { connect = [443, 80] }
    cost_limit = 2.5
    window = 128000
    depth_limit = 2
    create_limit = 4
    timeout_s = 600
    uid = 1000
    gid = 1000
    groups = [1000, 27]
    secrets = ["OPENAI_API_KEY", "GH_TOKEN"]
    models = ["local", "gpt-x"]
    path = ["proj", "user", "sys"]
    rules = ["allow self tool:shell use", "allow agent:rev shared:notes read"]
    on_restart = "resume"

    [resources]
    memory_max = "256m"
    pids_max = 64
    cpu_weight = 50
    disk_max = 2147483648

    [model_rate]
    requests_per_minute = 60
    tokens_per_minute = 200000

    [env]
    LANG = "C.UTF-8"
    TOKEN = "x=y"
"#;

#[test]
fn every_field_is_read_from_json() {
    assert_eq!(parse_json(JSON).unwrap(), expected());
}

#[test]
fn every_field_is_read_from_toml() {
    assert_eq!(parse_toml(TOML).unwrap(), expected());
}

#[test]
fn a_document_may_give_some_fields_only() {
    assert_eq!(parse_json("{}").unwrap(), PolicyRequest::default());
    assert_eq!(parse_toml("").unwrap(), PolicyRequest::default());
    let r = parse_json(r#"{"network": "none", "tools": null, "path": ""}"#).unwrap();
    assert_eq!(
        r,
        PolicyRequest {
            network: Some(Network::None),
            path: Some(vec![]),
            ..PolicyRequest::default()
        }
    );
    assert_eq!(
        parse_json(r#"{"network": "all"}"#).unwrap().network,
        Some(Network::All)
    );
    let r = parse_json(r#"{"resources": {"pids_max": 5}}"#).unwrap();
    assert_eq!(
        r.resources,
        Resources {
            pids_max: Some(5),
            ..Resources::default()
        }
    );
}

#[test]
fn memory_and_disk_sizes_are_bytes_or_suffixed_digits() {
    for (text, want) in [
        (r#"1024"#, 1024),
        (r#""1024""#, 1024),
        (r#""1K""#, 1 << 10),
        (r#""256M""#, 256 << 20),
        (r#""1G""#, 1 << 30),
        (r#""2t""#, 2 << 40),
    ] {
        let doc = format!(r#"{{"resources": {{"memory_max": {text}, "disk_max": {text}}}}}"#);
        let r = parse_json(&doc).unwrap().resources;
        assert_eq!(r.memory_max, Some(want), "{text}");
        assert_eq!(r.disk_max, Some(want), "{text}");
    }
}

#[test]
fn every_bad_value_is_refused_naming_its_field() {
    for (doc, field, says) in [
        (r#"[]"#, DOCUMENT, "must be an object"),
        (r#"{"tols": []}"#, "tols", "not a policy field"),
        (r#"{"tools": "shell"}"#, "tools", "must be an array"),
        (
            r#"{"on_restart": "retry"}"#,
            "on_restart",
            r#""retry": must be "cancel" or "resume""#,
        ),
        (r#"{"on_restart": true}"#, "on_restart", "must be a string"),
        (r#"{"tools": ["a", "b c"]}"#, "tools[1]", "whitespace"),
        (r#"{"tools": ["a", 1]}"#, "tools[1]", "must be a string"),
        (
            r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a/../b", "mode": "ro"}]}"#,
            "files[1].path",
            r#""/a/../b": ".." is not allowed"#,
        ),
        (
            r#"{"files": [{"path": "a", "mode": "ro"}]}"#,
            "files[0].path",
            "absolute",
        ),
        (
            r#"{"files": [{"path": "/a/./b", "mode": "ro"}]}"#,
            "files[0].path",
            r#""." is not allowed"#,
        ),
        (
            r#"{"files": [{"path": "/a\u0000", "mode": "ro"}]}"#,
            "files[0].path",
            "control characters",
        ),
        (
            r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a", "mode": "write"}]}"#,
            "files[1].mode",
            r#""write": must be hidden, ro or rw"#,
        ),
        (r#"{"files": [{"path": "/a"}]}"#, "files[0].mode", "missing"),
        (r#"{"files": [{"mode": "ro"}]}"#, "files[0].path", "missing"),
        (
            r#"{"files": [{"path": "/a", "mode": "ro", "deep": true}]}"#,
            "files[0].deep",
            "not a field here",
        ),
        (
            r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a/", "mode": "rw"}]}"#,
            "files[1].path",
            "files[0] already has a rule",
        ),
        (r#"{"files": ["/a"]}"#, "files[0]", "must be an object"),
        (
            r#"{"mounts": ["/a/../etc\t/etc\tro\t-"]}"#,
            "mounts[0].source",
            r#"".." is not allowed"#,
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/x/../etc", "mode": "ro"}]}"#,
            "mounts[0].target",
            r#"".." is not allowed"#,
        ),
        (
            r#"{"mounts": ["/a /b ro -"]}"#,
            "mounts[0]",
            "tab-separated",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "rx"}]}"#,
            "mounts[0].mode",
            "must be ro or rw",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b"}]}"#,
            "mounts[0].mode",
            "missing",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": ["bind", "rbind"]}]}"#,
            "mounts[0].options",
            "exclude each other",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": ["nosuid", "nosuid"]}]}"#,
            "mounts[0].options",
            "given twice",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": [1]}]}"#,
            "mounts[0].options[0]",
            "must be a string",
        ),
        (
            r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "flags": []}]}"#,
            "mounts[0].flags",
            "not a field here",
        ),
        (
            r#"{"mounts": ["/a\t/b\tro\t-", "/c\t/b\tro\t-"]}"#,
            "mounts[1].target",
            "already mounts",
        ),
        (
            r#"{"mounts": [3]}"#,
            "mounts[0]",
            "must be a mount line or an object",
        ),
        (
            r#"{"network": "some"}"#,
            "network",
            "must be \"none\", \"all\"",
        ),
        (
            r#"{"network": {"connect": [80, 70000]}}"#,
            "network.connect[1]",
            "70000: must be a port",
        ),
        (
            r#"{"network": {"connect": [0]}}"#,
            "network.connect[0]",
            "must be a port",
        ),
        (
            r#"{"network": {"connect": ["80"]}}"#,
            "network.connect[0]",
            "must be a whole number",
        ),
        (
            r#"{"network": {"bind": [80]}}"#,
            "network.bind",
            "not a field here",
        ),
        (r#"{"network": {}}"#, "network.connect", "missing"),
        (
            r#"{"cost_limit": -1}"#,
            "cost_limit",
            "-1: must be a number of dollars",
        ),
        (
            r#"{"cost_limit": "5"}"#,
            "cost_limit",
            "must be a number of dollars, not a string",
        ),
        (
            r#"{"window": 1.5}"#,
            "window",
            "1.5: must be a whole number",
        ),
        (r#"{"window": 0}"#, "window", "at least 1"),
        (r#"{"window": -2.0}"#, "window", "must be a whole number"),
        (
            r#"{"depth_limit": -1}"#,
            "depth_limit",
            "must be a whole number",
        ),
        (
            r#"{"depth_limit": 4294967296}"#,
            "depth_limit",
            "must be at most 4294967295",
        ),
        (r#"{"create_limit": true}"#, "create_limit", "not a boolean"),
        (r#"{"timeout_s": 0}"#, "timeout_s", "at least 1"),
        (
            r#"{"resources": {"memory_max": "256MB"}}"#,
            "resources.memory_max",
            "digits with K, M, G or T",
        ),
        (
            r#"{"resources": {"memory_max": "M"}}"#,
            "resources.memory_max",
            "digits with",
        ),
        (
            r#"{"resources": {"memory_max": "-1"}}"#,
            "resources.memory_max",
            "digits with",
        ),
        (
            r#"{"resources": {"memory_max": "99999999999T"}}"#,
            "resources.memory_max",
            "too large",
        ),
        (
            r#"{"resources": {"memory_max": 0}}"#,
            "resources.memory_max",
            "at least 1",
        ),
        (
            r#"{"resources": {"pids_max": "many"}}"#,
            "resources.pids_max",
            "must be a whole number",
        ),
        (
            r#"{"resources": {"cpu_weight": 0}}"#,
            "resources.cpu_weight",
            "must be from 1",
        ),
        (
            r#"{"resources": {"disk_max": "1Q"}}"#,
            "resources.disk_max",
            "digits with K, M, G or T",
        ),
        (
            r#"{"resources": {"disk_max": 0}}"#,
            "resources.disk_max",
            "at least 1 byte",
        ),
        (
            r#"{"resources": {"disk_max": "9223372036854775808"}}"#,
            "resources.disk_max",
            "at most 9223372036854775807 bytes",
        ),
        (
            r#"{"resources": {"disk_max": -5}}"#,
            "resources.disk_max",
            "must be a whole number, at least 0",
        ),
        (
            r#"{"resources": {"io_max": 1}}"#,
            "resources.io_max",
            "not a field here",
        ),
        (r#"{"resources": []}"#, "resources", "must be an object"),
        (
            r#"{"model_rate": {"requests_per_minute": 0}}"#,
            "model_rate.requests_per_minute",
            "0: must be at least 1",
        ),
        (
            r#"{"model_rate": {"tokens_per_minute": 1.5}}"#,
            "model_rate.tokens_per_minute",
            "must be a whole number",
        ),
        (
            r#"{"model_rate": {"tokens_per_minute": 9223372036854775808}}"#,
            "model_rate.tokens_per_minute",
            "must be at most 9223372036854775807",
        ),
        (
            r#"{"model_rate": {"requests_per_second": 1}}"#,
            "model_rate.requests_per_second",
            "not a field here",
        ),
        (r#"{"model_rate": 5}"#, "model_rate", "must be an object"),
        (r#"{"uid": "root"}"#, "uid", "must be a whole number"),
        (r#"{"gid": -5}"#, "gid", "must be a whole number"),
        (
            r#"{"groups": [1, "wheel"]}"#,
            "groups[1]",
            "must be a whole number",
        ),
        (
            r#"{"env": {"A": 1}}"#,
            "env.A",
            "must be a string, not a number",
        ),
        (
            r#"{"env": {"A=B": "1"}}"#,
            "env",
            r#""A=B": a name must not contain "=""#,
        ),
        (r#"{"env": {"": "1"}}"#, "env", "must not be empty"),
        (r#"{"env": {"A": "x\u0000y"}}"#, "env.A", "NUL or newline"),
        (r#"{"env": ["A=1"]}"#, "env", "must be an object"),
        (r#"{"env": {"A": null}}"#, "env.A", "values are hidden"),
        (
            r#"{"secrets": "OPENAI_API_KEY"}"#,
            "secrets",
            "must be an array of variable names",
        ),
        (
            r#"{"secrets": [1]}"#,
            "secrets[0]",
            "must be a variable name",
        ),
        (r#"{"secrets": ["A B"]}"#, "secrets", "whitespace"),
        (
            r#"{"secrets": ["BROOD_KEY"]}"#,
            "secrets.BROOD_KEY",
            "set by the runtime",
        ),
        (
            r#"{"env": {"K": "1"}, "secrets": ["K"]}"#,
            "secrets.K",
            "also in env",
        ),
        (r#"{"models": [""]}"#, "models[0]", "must not be empty"),
        (r#"{"path": "a::b"}"#, "path[1]", "must not be empty"),
        (
            r#"{"path": ["a", "a"]}"#,
            "path[1]",
            "already given at path[0]",
        ),
        (r#"{"path": ["a:b"]}"#, "path[0]", "must not contain \":\""),
        (r#"{"path": 3}"#, "path", "\"a:b:c\" or an array"),
        (
            r#"{"rules": ["allow self tool:x use", "allow self tool:x read"]}"#,
            "rules[1]",
            "not a permission of class tool",
        ),
        (
            r#"{"rules": ["permit self tool:x use"]}"#,
            "rules[0]",
            "must start with \"allow\"",
        ),
        (
            r#"{"rules": "allow self tool:x use"}"#,
            "rules",
            "must be an array",
        ),
    ] {
        let e = parse_json(doc).unwrap_err();
        assert_eq!(e.field, field, "{doc}: {e}");
        assert!(e.message.contains(says), "{doc}: want {says:?} in {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("policy field {field}: "))
        );
    }
    let e = parse_json("{").unwrap_err();
    assert_eq!(e.field, DOCUMENT);
    assert!(e.message.starts_with("not JSON"), "{e}");
}

#[test]
fn toml_values_json_lacks_are_refused_naming_the_field() {
    for (doc, field, says) in [
        ("window = 1979-05-27", "window", "a date is not a value"),
        ("cost_limit = nan", "cost_limit", "finite"),
        (
            "[resources]\nmemory_max = inf",
            "resources.memory_max",
            "finite",
        ),
        (
            "files = [{ path = \"/a/../b\", mode = \"ro\" }]",
            "files[0].path",
            "\"..\" is not allowed",
        ),
        (
            "mounts = [\"/a\\t/b/..\\tro\\t-\"]",
            "mounts[0].target",
            "\"..\" is not allowed",
        ),
        ("tols = []", "tols", "not a policy field"),
    ] {
        let e = parse_toml(doc).unwrap_err();
        assert_eq!(e.field, field, "{doc}: {e}");
        assert!(e.message.contains(says), "{doc}: {e}");
    }
    let e = parse_toml("window = \n").unwrap_err();
    assert_eq!(e.field, DOCUMENT);
    assert!(
        e.message.starts_with("not TOML") && e.message.contains("line 1"),
        "{e}"
    );
}

/// A policy with a value in every field.
fn full() -> Policy {
    let op = Policy::operator(1000, 1000, [27, 1000].into());
    effective(&op, &expected())
}

#[test]
fn to_json_round_trips_through_parse_and_effective() {
    for p in [
        Policy::operator(0, 0, BTreeSet::new()),
        Policy::operator(1000, 100, [4, 24].into()),
        full(),
        Policy {
            network: Network::All,
            cost_limit: Some(0.1),
            depth_limit: Some(0),
            resources: Resources {
                cpu_weight: Some(7),
                ..Resources::default()
            },
            ..full()
        },
        Policy {
            tools: Some(BTreeSet::new()),
            models: Some(BTreeSet::new()),
            network: Network::None,
            ..full()
        },
        Policy {
            on_restart: OnRestart::Cancel,
            ..full()
        },
        Policy {
            model_rate: ModelRate {
                tokens_per_minute: Some(7),
                ..ModelRate::default()
            },
            ..full()
        },
    ] {
        let p = p.normalise().unwrap();
        let json = to_json(&p);
        let text = serde_json::to_string_pretty(&json).unwrap();
        let req = parse_json(&text).unwrap();
        let op = Policy::operator(p.uid, p.gid, p.groups.clone());
        assert_eq!(effective(&op, &req), p, "{text}");
        assert_eq!(effective(&p, &req), p, "{text}");
    }
}

#[test]
fn to_json_spells_the_fields_as_spec_5_does() {
    let json = to_json(&full());
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys.join(" "),
        FIELDS.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    assert_eq!(json["network"], serde_json::json!({"connect": [80, 443]}));
    assert_eq!(json["mounts"][0], "/src\t/dst\tro\tbind,nosuid");
    assert_eq!(
        json["files"][0],
        serde_json::json!({"path": "/", "mode": "ro"})
    );
    let op = to_json(&Policy::operator(0, 0, BTreeSet::new()));
    for absent in [
        "tools",
        "cost_limit",
        "window",
        "depth_limit",
        "models",
        "resources",
    ] {
        assert!(op.get(absent).is_none(), "{absent}");
    }
    assert_eq!(op["network"], "all");
}

/// Issue 25: a document that puts values where names go, or a wrong kind
/// where values go, is refused without a byte of it in the error.
#[test]
fn values_given_in_the_wrong_place_are_not_echoed() {
    for doc in [
        r#"{"secrets": {"OPENAI_API_KEY": "sk-not-echoed-1"}}"#,
        r#"{"secrets": "sk-not-echoed-1"}"#,
        r#"{"env": "sk-not-echoed-1"}"#,
        r#"{"env": ["sk-not-echoed-1"]}"#,
    ] {
        let e = parse_json(doc).unwrap_err();
        assert!(!e.to_string().contains("sk-not-echoed"), "{doc}: {e}");
    }
}

/// Issue 25: a shown policy has the names of `env` and `secrets` and no
/// value; read back, the hidden values are refused, naming the variable.
#[test]
fn a_shown_policy_hides_every_env_value() {
    let p = full();
    let v = shown(&p);
    let text = v.to_string();
    for value in p.env.values() {
        assert!(!text.contains(value.as_str()), "{value} in {text}");
    }
    assert_eq!(v["env"], serde_json::json!({"LANG": null, "TOKEN": null}));
    assert_eq!(
        v["secrets"],
        serde_json::json!(["GH_TOKEN", "OPENAI_API_KEY"])
    );
    let e = from_value(&v).unwrap_err();
    assert_eq!(e.field, "env.LANG", "{e}");
    let mut whole = to_json(&p);
    hide_env(&mut whole);
    assert_eq!(whole, v);
}

#[test]
fn a_whole_float_is_a_whole_number() {
    // A JSON Schema `integer` (the API's document) is `10` or `10.0`.
    let r = parse_json(r#"{"window": 10.0, "timeout_s": 60.0, "resources": {"pids_max": 5.0}}"#)
        .unwrap();
    assert_eq!((r.window, r.timeout_s), (Some(10), Some(60)));
    assert_eq!(r.resources.pids_max, Some(5));
}
