//! The environment of an agent process, built from nothing (SPEC 5).
//!
//! Nothing of the supervisor's environment leaks into an agent except what this
//! module names: the `BROOD_*` identity, `CTX_*` for ctx compatibility,
//! `HOME PATH LANG TERM`, then what the caller passes (which may not override the
//! identity: an agent must not be able to claim another name).

use std::ffi::OsString;

/// Who an agent is, as its process is told.
#[derive(Debug, Clone)]
pub struct Identity {
    pub agent: String,
    pub run: String,
    pub parent: Option<String>,
    pub customer: Option<String>,
    pub session: String,
    pub tenant: String,
    /// The supervisor's control socket.
    pub socket: String,
    /// Path of the agent's policy file (read-only to it).
    pub policy: String,
    /// `$BROOD_ROOT/ctx`.
    pub ctx_root: String,
    /// `$BROOD_ROOT/ctx/home/<uid>`.
    pub ctx_home: String,
    /// The `artifact/` directory of its parent's channel to it, the one place
    /// of the parent's tree it may write (SPEC 4); `None` for a root.
    pub artifacts: Option<String>,
    /// The descriptor of its door to the supervisor, when it has one
    /// (`crate::spawn::DOOR_FD`).
    pub door: Option<i32>,
    /// Its run's W3C trace context (issue 30): the trace of its tree and its
    /// run's own span, for a harness that exports spans of its own to nest
    /// them under brood's.
    pub traceparent: Option<String>,
}

/// The base variables an agent gets besides its identity.
#[derive(Debug, Clone)]
pub struct Base {
    pub home: String,
    pub path: String,
    pub lang: String,
    pub term: String,
}

impl Base {
    /// Takes `HOME LANG TERM` from the supervisor's environment (with safe defaults)
    /// and a `PATH` that starts with `extra_path` (the directory of the `brood`
    /// binary, so programs inside a tree can call `brood spawn`).
    pub fn from_supervisor(extra_path: Option<&str>) -> Base {
        let get = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        let sys = get("PATH", "/usr/local/bin:/usr/bin:/bin");
        let path = match extra_path {
            Some(p) if !sys.split(':').any(|d| d == p) => format!("{p}:{sys}"),
            _ => sys,
        };
        Base {
            home: get("HOME", "/"),
            path,
            lang: get("LANG", "C.UTF-8"),
            term: get("TERM", "dumb"),
        }
    }
}

/// Names the caller may not set: they would forge the identity (a
/// `TRACEPARENT` of the caller's would hang an agent's spans under another
/// run's).
pub fn is_reserved(name: &str) -> bool {
    name.starts_with("BROOD_")
        || name.starts_with("CTX_")
        || name == "TRACEPARENT"
        || name == "TRACESTATE"
}

/// Builds the whole environment, in a fixed order. Caller variables with a
/// reserved name are dropped (the runtime refuses them before getting here).
pub fn build(id: &Identity, base: &Base, caller: &[(String, String)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(String, String)> = vec![
        ("BROOD_AGENT".into(), id.agent.clone()),
        ("BROOD_RUN".into(), id.run.clone()),
        ("BROOD_PARENT".into(), id.parent.clone().unwrap_or_default()),
        (
            "BROOD_CUSTOMER".into(),
            id.customer
                .clone()
                .or_else(|| id.parent.clone())
                .unwrap_or_default(),
        ),
        ("BROOD_SESSION".into(), id.session.clone()),
        ("BROOD_TENANT".into(), id.tenant.clone()),
        ("BROOD_SOCKET".into(), id.socket.clone()),
        ("BROOD_POLICY".into(), id.policy.clone()),
        ("CTX_ROOT".into(), id.ctx_root.clone()),
        ("CTX_HOME".into(), id.ctx_home.clone()),
        ("CTX_AGENT".into(), id.agent.clone()),
        (
            "BROOD_ARTIFACTS".into(),
            id.artifacts.clone().unwrap_or_default(),
        ),
        (
            "BROOD_DOOR".into(),
            id.door.map(|d| d.to_string()).unwrap_or_default(),
        ),
        ("HOME".into(), base.home.clone()),
        ("PATH".into(), base.path.clone()),
        ("LANG".into(), base.lang.clone()),
        ("TERM".into(), base.term.clone()),
    ];
    if let Some(tp) = &id.traceparent {
        // Before the base variables, with the rest of who it is.
        let at = env.len() - 4;
        env.insert(at, ("TRACEPARENT".into(), tp.clone()));
    }
    for (k, v) in caller {
        if is_reserved(k) {
            continue;
        }
        if let Some(slot) = env.iter_mut().find(|(ek, _)| ek == k) {
            slot.1 = v.clone();
        } else {
            env.push((k.clone(), v.clone()));
        }
    }
    env.into_iter().map(|(k, v)| (k.into(), v.into())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            agent: "a".into(),
            run: "r".into(),
            parent: Some("p".into()),
            customer: None,
            session: "default".into(),
            tenant: "user-0".into(),
            socket: "/s".into(),
            policy: "/p".into(),
            ctx_root: "/c".into(),
            ctx_home: "/c/home/0".into(),
            artifacts: Some("/c/home/0/agent/p/session/default/context/child/a/artifact".into()),
            door: Some(3),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        }
    }

    #[test]
    fn identity_cannot_be_forged_and_base_can_be_overridden() {
        let base = Base {
            home: "/h".into(),
            path: "/bin".into(),
            lang: "C".into(),
            term: "dumb".into(),
        };
        let env = build(
            &id(),
            &base,
            &[
                ("BROOD_AGENT".into(), "evil".into()),
                ("CTX_AGENT".into(), "evil".into()),
                ("BROOD_DOOR".into(), "9".into()),
                (
                    "TRACEPARENT".into(),
                    "00-11111111111111111111111111111111-2222222222222222-01".into(),
                ),
                ("TERM".into(), "xterm".into()),
                ("FOO".into(), "bar".into()),
            ],
        );
        let get = |k: &str| {
            env.iter()
                .find(|(ek, _)| ek == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("BROOD_AGENT").as_deref(), Some("a"));
        assert_eq!(get("CTX_AGENT").as_deref(), Some("a"));
        assert_eq!(get("BROOD_CUSTOMER").as_deref(), Some("p"));
        assert_eq!(get("BROOD_DOOR").as_deref(), Some("3"));
        assert_eq!(
            get("TRACEPARENT").as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(get("TERM").as_deref(), Some("xterm"));
        assert_eq!(get("FOO").as_deref(), Some("bar"));
        assert_eq!(env.iter().filter(|(k, _)| k == "BROOD_AGENT").count(), 1);
        assert_eq!(get("USER"), None);
    }
}
