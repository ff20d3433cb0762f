//! What a child hands back to its parent besides `result.md` (SPEC 4): the
//! references of `refs.jsonl`, checked line by line, and the files of its
//! `artifact/` directory, taken into the content-addressed blob store
//! (`$BROOD_ROOT/blobs/sha256/<hex>`) so the channel can be rebuilt like the rest
//! of the projection. And the parent's context pack for a finished child: the
//! result, the refs' summaries and the artifacts they name, never the child's
//! transcript.
//!
//! [`harvest`] reads files (hashes, copies), so the supervisor runs it off the
//! dispatcher, once a run that ended with a result has exited.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use brood_core::policy::{AbsPath, Mode, Policy};
use brood_store::{Artifact, ChannelOutput};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The kinds a reference may have (SPEC 4); the first is the default.
pub const REF_KINDS: &[&str] = &[
    "file",
    "artifact",
    "tool_output",
    "swap",
    "child_result",
    "patch",
];

/// At most this many files are taken from one `artifact/` directory, and at most
/// this many bytes in all: a child cannot make its parent's supervisor copy an
/// unbounded tree. Past either bound the result is refused, naming the bound.
pub const MAX_ARTIFACTS: usize = 1000;
pub const MAX_ARTIFACT_BYTES: u64 = 1 << 30;

/// An artifact's content is carried in the context pack inline when it is UTF-8
/// text of at most this many bytes; larger ones are named by path and hash.
pub const PACK_INLINE_MAX: u64 = 64 * 1024;

/// What [`harvest`] needs to know about the run that ended.
pub struct Input<'a> {
    /// The `refs` of the agent's `done` result, as sent.
    pub refs: &'a [Value],
    /// The parent's channel directory for this child (`None` for a root, which
    /// has no channel: its refs are checked but go nowhere).
    pub channel: Option<&'a Path>,
    /// The child's effective policy: a reference outside the channel is checked
    /// only where the child itself could read it.
    pub policy: &'a Policy,
    /// `$BROOD_ROOT/blobs`.
    pub blobs: &'a Path,
}

/// What a run hands back: recorded on the channel (`output`) and delivered to
/// the parent (`pack`, which is not stored: it is rebuilt from the store and
/// the blobs whenever needed).
#[derive(Debug, Clone, Default)]
pub struct Harvest {
    pub output: ChannelOutput,
    /// The refs and the artifacts they name, for the parent's context pack.
    pub pack_refs: Vec<Value>,
    pub pack_artifacts: Vec<Value>,
}

/// A result that must be refused, with the reason (naming the line or file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks the refs, takes the artifacts into the blob store and builds the
/// parent's context pack. A bad ref line or an artifact past the bounds refuses
/// the whole result; an IO failure of the blob store too (named), since a
/// result whose artifacts could not be kept cannot be rebuilt.
pub fn harvest(input: &Input<'_>) -> Result<Harvest, Refused> {
    let refs = check_refs(input.refs, input.channel, input.policy)?;
    let mut out = Harvest::default();
    out.output.refs = refs.iter().map(|r| format!("{r}\n")).collect();
    let Some(channel) = input.channel else {
        out.pack_refs = refs.iter().map(pack_ref).collect();
        return Ok(out);
    };
    let artifacts = take_artifacts(&channel.join("artifact"), input.blobs)?;
    for r in &refs {
        out.pack_refs.push(pack_ref(r));
        let Some(name) = artifact_named(r) else {
            continue;
        };
        if let Some(a) = artifacts.iter().find(|a| a.name == name) {
            out.pack_artifacts.push(pack_artifact(
                a,
                channel,
                &blob_path(input.blobs, &a.sha256),
            ));
        }
    }
    out.output.artifacts = artifacts;
    Ok(out)
}

/// The refs of a `done` result, each checked and normalised (SPEC 4): `path`
/// and `summary` required, single line; `id` generated when absent (`ref-<line>`,
/// so a rebuild writes the same); `kind` one of [`REF_KINDS`], default `file`;
/// `hash`, when present, `sha256:<64 hex>` and equal to the file's. A relative
/// `path` is relative to the channel directory (`artifact/x` names an artifact);
/// an absolute one is hashed only where the child's policy lets it read.
pub fn check_refs(
    refs: &[Value],
    channel: Option<&Path>,
    policy: &Policy,
) -> Result<Vec<Value>, Refused> {
    let mut out = Vec::with_capacity(refs.len());
    for (i, r) in refs.iter().enumerate() {
        let line = i + 1;
        let bad = |why: String| Refused(format!("refs.jsonl line {line}: {why}"));
        let Some(obj) = r.as_object() else {
            return Err(bad(format!("expected a JSON object, got {r}")));
        };
        let text = |field: &str, required: bool| -> Result<Option<String>, Refused> {
            match obj.get(field) {
                None | Some(Value::Null) if !required => Ok(None),
                None | Some(Value::Null) => Err(bad(format!("`{field}` is required"))),
                Some(Value::String(s)) if s.is_empty() && required => {
                    Err(bad(format!("`{field}` is empty")))
                }
                Some(Value::String(s)) if s.contains(['\n', '\r', '\0']) => Err(bad(format!(
                    "`{field}` must be a single line without NUL bytes"
                ))),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(bad(format!("`{field}` must be a string, got {v}"))),
            }
        };
        let path = text("path", true)?.unwrap_or_default();
        let summary = text("summary", true)?.unwrap_or_default();
        let id = text("id", false)?.unwrap_or_else(|| format!("ref-{line}"));
        let kind = text("kind", false)?.unwrap_or_else(|| "file".to_owned());
        if !REF_KINDS.contains(&kind.as_str()) {
            return Err(bad(format!(
                "`kind` {kind:?} is not one of {}",
                REF_KINDS.join(" ")
            )));
        }
        let hash = text("hash", false)?;
        if let Some(h) = &hash {
            let Some(want) = h
                .strip_prefix("sha256:")
                .filter(|x| x.len() == 64 && x.bytes().all(|b| b.is_ascii_hexdigit()))
            else {
                return Err(bad(format!("`hash` {h:?} is not sha256:<64 hex digits>")));
            };
            let file = resolve(&path, channel, policy).map_err(&bad)?;
            let got = sha256_file(&file)
                .map_err(|e| bad(format!("cannot hash {}: {e}", file.display())))?
                .0;
            if !got.eq_ignore_ascii_case(want) {
                return Err(bad(format!(
                    "`hash` does not match {}: it is sha256:{got}",
                    file.display()
                )));
            }
        }
        // Unknown fields are kept (the protocol ignores what it does not know,
        // and the parent may); the known ones come first in a fixed order.
        let mut m = Map::new();
        m.insert("id".into(), id.into());
        m.insert("kind".into(), kind.into());
        m.insert("path".into(), path.into());
        m.insert("summary".into(), summary.into());
        if let Some(h) = hash {
            m.insert("hash".into(), h.to_ascii_lowercase().into());
        }
        for (k, v) in obj {
            if !m.contains_key(k) {
                m.insert(k.clone(), v.clone());
            }
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

/// Where a ref's file is, for its hash: relative paths inside the channel
/// directory (never above it); absolute ones only where the child may read.
fn resolve(path: &str, channel: Option<&Path>, policy: &Policy) -> Result<PathBuf, String> {
    let p = Path::new(path);
    if p.is_absolute() {
        let abs = AbsPath::new("path", path).map_err(|e| e.to_string())?;
        if policy.mode_at(&abs) == Mode::Hidden {
            return Err(format!(
                "{path} is hidden from this agent by its policy, so its hash cannot be checked"
            ));
        }
        return Ok(p.to_path_buf());
    }
    let Some(channel) = channel else {
        return Err(format!(
            "a relative path ({path}) names a file of the parent's channel, and a root has none"
        ));
    };
    relative(path)
        .map(|r| channel.join(r))
        .ok_or_else(|| format!("{path:?} must stay inside the channel (no `..`)"))
}

/// `path` as a relative path of plain components, or `None`.
pub(crate) fn relative(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// The artifact a ref names: a relative path under `artifact/`.
fn artifact_named(r: &Value) -> Option<String> {
    let p = relative(r["path"].as_str()?)?;
    let rest = p.strip_prefix("artifact").ok()?;
    rest.to_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

fn pack_ref(r: &Value) -> Value {
    json!({"id": r["id"], "kind": r["kind"], "path": r["path"], "summary": r["summary"]})
}

fn pack_artifact(a: &Artifact, channel: &Path, blob: &Path) -> Value {
    let mut v = json!({
        "name": a.name,
        "path": channel.join("artifact").join(&a.name).to_string_lossy(),
        "sha256": a.sha256,
        "size": a.size,
    });
    if a.size <= PACK_INLINE_MAX
        && let Ok(bytes) = fs::read(blob)
        && let Ok(text) = String::from_utf8(bytes)
    {
        v["content"] = text.into();
    }
    v
}

/// The parent's context pack for a finished child (SPEC 4), delivered in the
/// protocol's `child` event: never the child's transcript.
pub fn pack(result: Option<&str>, h: Option<&Harvest>) -> Value {
    json!({
        "result": result,
        "refs": h.map(|h| h.pack_refs.clone()).unwrap_or_default(),
        "artifacts": h.map(|h| h.pack_artifacts.clone()).unwrap_or_default(),
    })
}

/// `blobs/sha256/<hex>`.
pub fn blob_path(blobs: &Path, sha256: &str) -> PathBuf {
    blobs.join("sha256").join(sha256)
}

/// Every regular file under `dir` (symlinks and other kinds are not followed
/// or taken), copied into the blob store, sorted by name.
fn take_artifacts(dir: &Path, blobs: &Path) -> Result<Vec<Artifact>, Refused> {
    let mut files = Vec::new();
    walk(dir, Path::new(""), &mut files)
        .map_err(|e| Refused(format!("reading {}: {e}", dir.display())))?;
    if files.len() > MAX_ARTIFACTS {
        return Err(Refused(format!(
            "{} holds {} files; at most {MAX_ARTIFACTS} are taken",
            dir.display(),
            files.len()
        )));
    }
    files.sort();
    let mut out = Vec::with_capacity(files.len());
    let mut total = 0u64;
    for rel in files {
        let src = dir.join(&rel);
        let (sha256, size) = put_blob(blobs, &src)
            .map_err(|e| Refused(format!("artifact {}: {e}", src.display())))?;
        total += size;
        if total > MAX_ARTIFACT_BYTES {
            return Err(Refused(format!(
                "the artifacts in {} exceed {MAX_ARTIFACT_BYTES} bytes",
                dir.display()
            )));
        }
        out.push(Artifact {
            name: rel.to_string_lossy().into_owned(),
            sha256,
            size,
        });
    }
    Ok(out)
}

fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let t = e.file_type()?;
        let name = rel.join(e.file_name());
        if t.is_dir() {
            walk(&e.path(), &name, out)?;
        } else if t.is_file() && e.file_name().to_str().is_some() {
            out.push(name);
        }
        if out.len() > MAX_ARTIFACTS {
            return Ok(());
        }
    }
    Ok(())
}

/// Copies `src` into the blob store under its hash (temp file, then rename;
/// an existing blob is kept: same hash, same bytes). Opened with `O_NOFOLLOW`,
/// so a symlink swapped in after the walk is not followed.
pub fn put_blob(blobs: &Path, src: &Path) -> io::Result<(String, u64)> {
    let dir = blobs.join("sha256");
    fs::create_dir_all(&dir)?;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(src)?;
    let tmp = dir.join(format!(
        ".in.{}.{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    let r = (|| {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        let (hex, size) = hash_copy(&mut f, Some(&mut out))?;
        let dst = dir.join(&hex);
        if dst.exists() {
            fs::remove_file(&tmp)?;
        } else {
            fs::rename(&tmp, &dst)?;
        }
        Ok((hex, size))
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// SHA-256 of a file (not following a final symlink), with its size.
pub fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    hash_copy(&mut f, None)
}

/// Reads `f` to its end, hashing it and, when given, copying it to `out`:
/// the SHA-256 in lowercase hex and the size.
fn hash_copy(f: &mut File, mut out: Option<&mut File>) -> io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((hex(&h.finalize()), size));
        }
        h.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n])?;
        }
        size += n as u64;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator() -> Policy {
        Policy::operator(0, 0, Default::default())
    }

    #[test]
    fn refs_are_normalised_with_defaults() {
        let d = tempfile::tempdir().unwrap();
        let refs = vec![json!({"path": "src/a.rs", "summary": "the parser", "extra": 1})];
        let out = check_refs(&refs, Some(d.path()), &operator()).unwrap();
        assert_eq!(
            out[0].to_string(),
            r#"{"id":"ref-1","kind":"file","path":"src/a.rs","summary":"the parser","extra":1}"#
        );
    }

    #[test]
    fn each_bad_line_is_named() {
        let d = tempfile::tempdir().unwrap();
        let ok = json!({"path": "a", "summary": "s"});
        let cases = [
            (json!("x"), "expected a JSON object"),
            (json!({"summary": "s"}), "`path` is required"),
            (json!({"path": "a"}), "`summary` is required"),
            (json!({"path": "a", "summary": "two\nlines"}), "single line"),
            (json!({"path": "a", "summary": 3}), "must be a string"),
            (json!({"path": "a", "summary": "s", "kind": "x"}), "`kind`"),
            (
                json!({"path": "a", "summary": "s", "hash": "md5:00"}),
                "sha256:<64",
            ),
            (
                json!({"path": "../up", "summary": "s", "hash": format!("sha256:{}", "0".repeat(64))}),
                "inside the channel",
            ),
        ];
        for (bad, why) in cases {
            let e = check_refs(&[ok.clone(), bad.clone()], Some(d.path()), &operator())
                .unwrap_err()
                .0;
            assert!(e.starts_with("refs.jsonl line 2: "), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e} lacks {why}");
        }
    }

    #[test]
    fn a_hash_is_checked_against_the_file() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("artifact")).unwrap();
        fs::write(d.path().join("artifact/out.txt"), "hello\n").unwrap();
        let good = "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        let r = json!({"path": "artifact/out.txt", "summary": "s", "hash": good});
        assert!(check_refs(&[r], Some(d.path()), &operator()).is_ok());
        let bad = format!("sha256:{}", "a".repeat(64));
        let r = json!({"path": "artifact/out.txt", "summary": "s", "hash": bad});
        let e = check_refs(&[r], Some(d.path()), &operator()).unwrap_err().0;
        assert!(e.contains("does not match") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn artifacts_go_to_the_blob_store_and_symlinks_are_not_taken() {
        let d = tempfile::tempdir().unwrap();
        let ch = d.path().join("ch");
        fs::create_dir_all(ch.join("artifact/sub")).unwrap();
        fs::write(ch.join("artifact/a.txt"), "alpha").unwrap();
        fs::write(ch.join("artifact/sub/b.txt"), "beta").unwrap();
        fs::write(d.path().join("secret"), "secret").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), ch.join("artifact/link")).unwrap();
        let blobs = d.path().join("blobs");
        let refs = vec![json!({"path": "artifact/a.txt", "summary": "the a", "kind": "artifact"})];
        let h = harvest(&Input {
            refs: &refs,
            channel: Some(&ch),
            policy: &operator(),
            blobs: &blobs,
        })
        .unwrap();
        let names: Vec<_> = h.output.artifacts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a.txt", "sub/b.txt"]);
        for a in &h.output.artifacts {
            let bytes = fs::read(blob_path(&blobs, &a.sha256)).unwrap();
            assert_eq!(bytes.len() as u64, a.size);
            assert_eq!(
                sha256_file(&blob_path(&blobs, &a.sha256)).unwrap().0,
                a.sha256
            );
        }
        // The pack names the artifact a ref names, with its content, and only it.
        assert_eq!(h.pack_artifacts.len(), 1);
        assert_eq!(h.pack_artifacts[0]["content"], "alpha");
        assert_eq!(h.pack_refs[0]["summary"], "the a");
        assert_eq!(
            h.output.refs,
            "{\"id\":\"ref-1\",\"kind\":\"artifact\",\"path\":\"artifact/a.txt\",\"summary\":\"the a\"}\n"
        );
    }
}
