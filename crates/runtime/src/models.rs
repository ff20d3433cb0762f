//! The model gateway's contract (issue 31, docs/models.md): the operator's
//! providers, their keys and the price of each model (`[models]` of
//! `config.toml`), and what a call costs (`meter`). The HTTP side, the
//! per-agent endpoint and the forwarding, is brood-server's `gateway`; the
//! dispatcher's side (who may call, what was spent) is `supervisor::models`.
//!
//! ```toml
//! [models.openai]                 # /v1/chat/completions, /v1/responses
//! base_url = "https://api.openai.com"
//! key_env = "OPENAI_API_KEY"      # read once by the daemon, then removed from its environment
//! [models.anthropic]              # /v1/messages
//! base_url = "https://api.anthropic.com"
//! key_file = "/etc/brood/anthropic.key"   # mode 0600 (or 0400): only the daemon reads it
//! [models.prices]                 # dollars per million tokens
//! "gpt-4o-mini" = { input = 0.15, output = 0.6 }
//! ```

pub mod meter;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The two wire protocols the gateway speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// OpenAI's chat completions and responses (and every server that
    /// copies them).
    OpenAi,
    /// Anthropic's messages.
    Anthropic,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::OpenAi => "openai",
            Kind::Anthropic => "anthropic",
        }
    }

    /// The variables a client of this protocol reads its key from: set to
    /// the agent's own gateway token, never to a provider's key.
    pub fn key_vars(self) -> &'static [&'static str] {
        match self {
            Kind::OpenAi => &["OPENAI_API_KEY"],
            Kind::Anthropic => &["ANTHROPIC_API_KEY"],
        }
    }
}

/// Where a provider's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A variable of the daemon's own environment, removed from it once read.
    Env(String),
    /// A file only the daemon may read (no group or other bits).
    File(PathBuf),
    /// No key (a local server that asks for none).
    None,
}

/// `[models.openai]` or `[models.anthropic]` as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The provider's origin (and path prefix, if any) before `/v1/...`.
    pub base_url: String,
    pub key: KeySource,
}

/// What a million tokens of a model cost, in dollars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

impl Price {
    pub fn cost(&self, tokens_in: u64, tokens_out: u64) -> f64 {
        (tokens_in as f64 * self.input + tokens_out as f64 * self.output) / 1_000_000.0
    }
}

/// `[models]` as written: nothing read yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelsConfig {
    pub openai: Option<ProviderConfig>,
    pub anthropic: Option<ProviderConfig>,
    pub prices: BTreeMap<String, Price>,
}

/// A provider's key: never shown by `Debug`, never written anywhere.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(String);

impl Key {
    pub fn new(k: impl Into<String>) -> Key {
        Key(k.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(hidden)")
    }
}

/// One provider, its key read.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub kind: Kind,
    pub base_url: String,
    pub key: Option<Key>,
    /// The file the key came from: covered by the veil, so no agent can
    /// open it whatever its policy says.
    pub key_file: Option<PathBuf>,
}

/// The providers the gateway forwards to, keys read, with the price table.
#[derive(Debug, Clone, Default)]
pub struct Providers {
    pub openai: Option<Upstream>,
    pub anthropic: Option<Upstream>,
    pub prices: BTreeMap<String, Price>,
}

impl Providers {
    pub fn upstream(&self, kind: Kind) -> Option<&Upstream> {
        match kind {
            Kind::OpenAi => self.openai.as_ref(),
            Kind::Anthropic => self.anthropic.as_ref(),
        }
    }

    pub fn price(&self, model: &str) -> Option<Price> {
        self.prices.get(model).copied()
    }

    /// Every key's value: what an agent's environment may never hold.
    pub fn key_values(&self) -> impl Iterator<Item = &str> {
        [&self.openai, &self.anthropic]
            .into_iter()
            .flatten()
            .filter_map(|u| u.key.as_ref().map(Key::expose))
    }

    /// The files keys were read from, for the veil.
    pub fn key_files(&self) -> Vec<PathBuf> {
        [&self.openai, &self.anthropic]
            .into_iter()
            .flatten()
            .filter_map(|u| u.key_file.clone())
            .collect()
    }
}

impl ModelsConfig {
    pub fn is_empty(&self) -> bool {
        self.openai.is_none() && self.anthropic.is_none()
    }

    /// `[models]`: `openai`, `anthropic` and `prices`, each optional; an
    /// unknown key is an error naming it.
    pub fn parse(v: &toml::Value) -> Result<ModelsConfig, String> {
        let t = v.as_table().ok_or("models must be a table")?;
        let mut c = ModelsConfig::default();
        for (k, v) in t {
            match k.as_str() {
                "openai" => c.openai = Some(provider("models.openai", v)?),
                "anthropic" => c.anthropic = Some(provider("models.anthropic", v)?),
                "prices" => c.prices = prices(v)?,
                other => {
                    return Err(format!(
                        "unknown key models.{other} (expected openai, anthropic or prices)"
                    ));
                }
            }
        }
        Ok(c)
    }

    /// Reads every key (from the daemon's environment or its file). A
    /// variable that is not set, a file that cannot be read or that others
    /// may read, and an empty key are errors naming where they were looked
    /// for. The variables are left for the caller to remove (it owns the
    /// process's environment).
    pub fn load(&self) -> Result<Providers, String> {
        let one = |kind: Kind, c: &Option<ProviderConfig>| -> Result<Option<Upstream>, String> {
            let Some(c) = c else {
                return Ok(None);
            };
            let field = format!("models.{}", kind.word());
            let (key, key_file) = match &c.key {
                KeySource::None => (None, None),
                KeySource::Env(var) => {
                    let v = std::env::var(var).map_err(|_| {
                        format!("{field}.key_env: the variable {var} is not set in the daemon's environment")
                    })?;
                    (Some(v), None)
                }
                KeySource::File(p) => (Some(read_key_file(&field, p)?), Some(p.clone())),
            };
            let key = match key.map(|k| k.trim().to_owned()) {
                Some(k) if k.is_empty() => return Err(format!("{field}: the key is empty")),
                k => k.map(Key),
            };
            Ok(Some(Upstream {
                kind,
                base_url: c.base_url.trim_end_matches('/').to_owned(),
                key,
                key_file,
            }))
        };
        Ok(Providers {
            openai: one(Kind::OpenAi, &self.openai)?,
            anthropic: one(Kind::Anthropic, &self.anthropic)?,
            prices: self.prices.clone(),
        })
    }

    /// The variables keys are read from: removed from the daemon's
    /// environment once read, so nothing it starts inherits them.
    pub fn key_vars(&self) -> Vec<String> {
        [&self.openai, &self.anthropic]
            .into_iter()
            .flatten()
            .filter_map(|c| match &c.key {
                KeySource::Env(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }
}

/// A key file: a regular file, not a link, that neither its group nor
/// others may read (the daemon's alone), holding the key on its first line.
fn read_key_file(field: &str, p: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = p.display();
    let meta = std::fs::symlink_metadata(p)
        .map_err(|e| format!("{field}.key_file: reading {shown}: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "{field}.key_file: {shown} is not a regular file (a link is not followed)"
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{field}.key_file: {shown} has mode {mode:04o}: its group or others may read it \
             (chmod 600 it, so only the daemon's user does)"
        ));
    }
    let text = std::fs::read_to_string(p)
        .map_err(|e| format!("{field}.key_file: reading {shown}: {e}"))?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

fn provider(field: &str, v: &toml::Value) -> Result<ProviderConfig, String> {
    let t = v
        .as_table()
        .ok_or_else(|| format!("{field} must be a table"))?;
    let mut base_url = None;
    let mut key = KeySource::None;
    let string = |k: &str, v: &toml::Value| {
        v.as_str()
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("{field}.{k} must be a non-empty string"))
    };
    for (k, v) in t {
        match k.as_str() {
            "base_url" => {
                let u = string(k, v)?;
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    return Err(format!(
                        "{field}.base_url must start with http:// or https://, not {u:?}"
                    ));
                }
                base_url = Some(u);
            }
            "key_env" | "key_file" if key != KeySource::None => {
                return Err(format!("{field}: give key_env or key_file, not both"));
            }
            "key_env" => key = KeySource::Env(string(k, v)?),
            "key_file" => {
                let p = PathBuf::from(string(k, v)?);
                if !p.is_absolute() {
                    return Err(format!(
                        "{field}.key_file must be an absolute path, not {}",
                        p.display()
                    ));
                }
                key = KeySource::File(p);
            }
            other => {
                return Err(format!(
                    "unknown key {field}.{other} (expected base_url, key_env or key_file)"
                ));
            }
        }
    }
    let base_url = base_url.ok_or_else(|| format!("{field}.base_url is missing"))?;
    Ok(ProviderConfig { base_url, key })
}

fn prices(v: &toml::Value) -> Result<BTreeMap<String, Price>, String> {
    let t = v.as_table().ok_or("models.prices must be a table")?;
    let mut out = BTreeMap::new();
    for (model, p) in t {
        let field = format!("models.prices.{model:?}");
        let pt = p
            .as_table()
            .ok_or_else(|| format!("{field} must be a table {{ input = N, output = N }}"))?;
        let mut input = None;
        let mut output = None;
        for (k, v) in pt {
            let n = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| {
                    format!("{field}.{k} must be a number of dollars per million tokens, 0 or more")
                })?;
            match k.as_str() {
                "input" => input = Some(n),
                "output" => output = Some(n),
                other => {
                    return Err(format!(
                        "unknown key {field}.{other} (expected input or output)"
                    ));
                }
            }
        }
        let (Some(input), Some(output)) = (input, output) else {
            return Err(format!("{field} needs both input and output"));
        };
        out.insert(model.clone(), Price { input, output });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelsConfig, String> {
        let doc: toml::Table = toml::from_str(text).unwrap();
        ModelsConfig::parse(&doc["models"])
    }

    #[test]
    fn providers_and_prices_are_read_and_refused_by_name() {
        let c = parse(
            "[models.openai]\nbase_url = \"http://127.0.0.1:9/\"\nkey_env = \"K\"\n\
             [models.prices]\n\"gpt-x\" = { input = 2, output = 8.5 }\n",
        )
        .unwrap();
        assert_eq!(
            c.openai,
            Some(ProviderConfig {
                base_url: "http://127.0.0.1:9/".into(),
                key: KeySource::Env("K".into())
            })
        );
        assert_eq!(c.prices["gpt-x"].cost(1_000_000, 2_000_000), 19.0);
        assert_eq!(c.key_vars(), vec!["K".to_owned()]);
        for (bad, says) in [
            (
                "[models.openai]\nkey_env = \"K\"\n",
                "models.openai.base_url is missing",
            ),
            (
                "[models.openai]\nbase_url = \"ftp://x\"\n",
                "must start with http:// or https://",
            ),
            (
                "[models.openai]\nbase_url = \"http://x\"\nkey_env = \"A\"\nkey_file = \"/k\"\n",
                "not both",
            ),
            (
                "[models.anthropic]\nbase_url = \"http://x\"\nkey_file = \"k\"\n",
                "absolute path",
            ),
            ("[models.openia]\n", "unknown key models.openia"),
            (
                "[models.prices]\nm = { input = 1 }\n",
                "needs both input and output",
            ),
            (
                "[models.prices]\nm = { input = -1, output = 1 }\n",
                "models.prices.\"m\".input",
            ),
            (
                "[models.prices]\nm = { input = 1, output = 1, cache = 2 }\n",
                "unknown key models.prices.\"m\".cache",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn key_files_must_be_the_daemons_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        std::fs::write(&p, "sk-secret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = ModelsConfig {
            anthropic: Some(ProviderConfig {
                base_url: "http://x/".into(),
                key: KeySource::File(p.clone()),
            }),
            ..Default::default()
        };
        let e = c.load().unwrap_err();
        assert!(e.contains("mode 0644"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ps = c.load().unwrap();
        let a = ps.anthropic.as_ref().unwrap();
        assert_eq!(a.base_url, "http://x");
        assert_eq!(ps.key_values().collect::<Vec<_>>(), vec!["sk-secret"]);
        assert_eq!(ps.key_files(), vec![p.clone()]);
        assert!(!format!("{ps:?}").contains("sk-secret"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let c = ModelsConfig {
            anthropic: Some(ProviderConfig {
                base_url: "http://x".into(),
                key: KeySource::File(link),
            }),
            ..Default::default()
        };
        assert!(c.load().unwrap_err().contains("not a regular file"));
    }
}
