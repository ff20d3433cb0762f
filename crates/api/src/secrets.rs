//! Secret values as a request carries them (issue 25): the values of the
//! variables a policy names in `secrets`, given by the caller that starts a
//! root (`POST /api/agents`, `resume`, `brood run --secret NAME`) and held
//! by the supervisor in memory only.
//!
//! [`Secrets`] is a map of names to values that never shows a value: its
//! `Debug` lists the names, and reading one from JSON refuses a wrong shape
//! without echoing any of the document (serde's own messages quote a string
//! it did not expect, and a 400 may be logged by a proxy or kept as an
//! idempotent answer). It serialises its values, since a client sends them;
//! nothing of the server serialises one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Values by variable name; see the module docs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(BTreeMap<String, String>);

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Names and values, sorted by name: for the one place that needs the
    /// values, the agent's environment.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The values of `names` that are here (a child's, from its parent's).
    pub fn only(&self, names: &BTreeSet<String>) -> Secrets {
        Secrets(
            self.0
                .iter()
                .filter(|(k, _)| names.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// The first of `names` without a value here.
    pub fn missing<'a>(&self, names: &'a BTreeSet<String>) -> Option<&'a str> {
        names
            .iter()
            .find(|k| !self.0.contains_key(*k))
            .map(String::as_str)
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.0.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Serialize for Secrets {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secrets, D::Error> {
        // `any`, not `map`: a deserializer asked for a map reports another
        // kind itself, quoting it; asked for anything, it hands the kind to
        // the visitor, which names it without its content.
        d.deserialize_any(SecretsVisitor)
    }
}

const SHAPE: &str = "an object of variable names to string values";

struct SecretsVisitor;

impl SecretsVisitor {
    /// A wrong kind of document, named without its content.
    fn wrong<E: de::Error>(kind: &str) -> E {
        E::custom(format!("must be {SHAPE}, not {kind} (not shown)"))
    }
}

impl<'de> Visitor<'de> for SecretsVisitor {
    type Value = Secrets;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SHAPE)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Secrets, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(k) = map.next_key::<String>()? {
            // Read as any JSON value, then judged here, so a wrong kind is
            // named without quoting it.
            match map.next_value::<Value>()? {
                Value::String(v) => {
                    out.insert(k, v);
                }
                other => {
                    let kind = match other {
                        Value::Null => "null",
                        Value::Bool(_) => "a boolean",
                        Value::Number(_) => "a number",
                        Value::Array(_) => "an array",
                        _ => "an object",
                    };
                    return Err(de::Error::custom(format!(
                        "{}: must be a string, not {kind} (not shown)",
                        k.escape_debug()
                    )));
                }
            }
        }
        Ok(Secrets(out))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Secrets, E> {
        Err(Self::wrong("a string"))
    }

    fn visit_string<E: de::Error>(self, _: String) -> Result<Secrets, E> {
        Err(Self::wrong("a string"))
    }

    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Secrets, E> {
        Err(Self::wrong("a string"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Secrets, A::Error> {
        Err(Self::wrong("an array"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Secrets, E> {
        Err(Self::wrong("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Secrets, E> {
        Err(Self::wrong("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Secrets, E> {
        Err(Self::wrong("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Secrets, E> {
        Err(Self::wrong("a number"))
    }
}

#[cfg(test)]
mod tests {
    use crate::{SpawnBody, parse};

    const VALUE: &str = "sk-never-echoed-42";

    #[test]
    fn values_are_read_and_never_shown_in_debug() {
        let b: SpawnBody =
            parse(format!(r#"{{"argv": ["x"], "secrets": {{"KEY": "{VALUE}"}}}}"#).as_bytes())
                .unwrap();
        let s = b.secrets.clone().unwrap();
        assert_eq!(s.get("KEY"), Some(VALUE));
        let debug = format!("{b:?}");
        assert!(debug.contains("KEY") && !debug.contains(VALUE), "{debug}");
    }

    #[test]
    fn a_wrong_shape_is_refused_without_echoing_it() {
        for doc in [
            format!(r#"{{"argv": ["x"], "secrets": "{VALUE}"}}"#),
            format!(r#"{{"argv": ["x"], "secrets": ["{VALUE}"]}}"#),
            format!(r#"{{"argv": ["x"], "secrets": {{"KEY": ["{VALUE}"]}}}}"#),
            format!(r#"{{"argv": ["x"], "secrets": {{"KEY": {{"v": "{VALUE}"}}}}}}"#),
            format!(r#"{{"argv": ["x"], "secrets": {{"KEY": "{VALUE}}}"#),
        ] {
            let e = parse::<SpawnBody>(doc.as_bytes()).unwrap_err();
            assert!(!e.contains(VALUE), "{doc}: {e}");
            assert!(
                e.contains("secrets") || e.starts_with("body:"),
                "{doc}: {e}"
            );
        }
    }
}
