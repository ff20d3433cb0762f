//! What a child hands back to its parent besides `result.md` (SPEC 4): the
//! references of `refs.jsonl`, checked line by line, and the files of its
//! `artifact/` directory, taken into the content-addressed blob store
//! (`$BROOD_ROOT/blobs/sha256/<hex>`) so the channel can be rebuilt like the rest
//! of the projection. And the parent's context pack for a finished child: the
//! result, the refs' summaries and the artifacts they name, never the child's
//! transcript.
//!
//! [`harvest`] reads files (hashes, copies), so the supervisor runs it off the
//! dispatcher, once a run that ended with a result has exited and its group is
//! dead and empty. How the child's files are opened (as the child, no link
//! followed, regular files only, bounded) is [`open`]'s; how the blobs are
//! staged and committed whole, [`blobs`]'; how `artifact/` is emptied of what
//! no record accounts for, [`clear`]'s; how a running child's `artifact/` is
//! measured against its `disk_max`, [`usage`]'s.

mod blobs;
pub mod clear;
mod open;
pub mod shared;
pub mod usage;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use brood_core::policy::{AbsPath, Mode, Policy};
use brood_launch::confine::Confinement;
use brood_store::{Artifact, ChannelOutput};
use serde_json::{Map, Value, json};

use blobs::{Staged, blob_temp, new_blob_file};
pub use blobs::{blob_path, remove_stale_temps};
pub use open::{MAX_DEPTH, MAX_REF_BYTES};

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
/// this many bytes in all (or the child's `resources.disk_max`, when lower):
/// a child cannot make its parent's supervisor copy an unbounded tree. Past
/// either bound the result is refused, naming the bound.
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
    /// Whose rights the child's files are opened with: the child's own.
    pub confinement: Confinement,
    /// Set when the supervisor stopped waiting (the collection's time
    /// limit): whatever this harvest then finds, it keeps nothing.
    pub abandoned: &'a AtomicBool,
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

/// The most a result's artifacts may hold together: the child's `disk_max`
/// when it is lower than [`MAX_ARTIFACT_BYTES`], and how a refusal names it.
#[derive(Debug, Clone)]
pub struct ArtifactCap {
    pub bytes: u64,
    pub named: String,
}

impl ArtifactCap {
    pub fn of(policy: &Policy) -> ArtifactCap {
        match policy.resources.disk_max {
            Some(d) if d <= MAX_ARTIFACT_BYTES => ArtifactCap {
                bytes: d,
                named: format!("resources.disk_max, {d} bytes"),
            },
            _ => ArtifactCap {
                bytes: MAX_ARTIFACT_BYTES,
                named: format!("{MAX_ARTIFACT_BYTES} bytes"),
            },
        }
    }
}

/// Checks the refs, takes the artifacts into the blob store and builds the
/// parent's context pack. A bad ref line, a ref or artifact that is not a
/// regular file the child could read, or artifacts past the bounds (in all
/// at most [`ArtifactCap::of`] the child's policy) refuse the whole result,
/// naming the line or file; an IO failure of the blob store too, since a
/// result whose artifacts could not be kept cannot be rebuilt.
///
/// A refused result leaves nothing behind (issue 24 item 6): its blobs were
/// only staged, and are removed; its `artifact/` is emptied. An accepted one
/// leaves in `artifact/` exactly the artifacts recorded (what was not taken,
/// a link, a FIFO, a name that is not UTF-8, goes), as a rebuild writes it.
/// The child's group is dead by now, so nothing it started can write more.
pub fn harvest(input: &Input<'_>) -> Result<Harvest, Refused> {
    let mut staged = Staged::new(input.blobs);
    let gathered = gather(input, &mut staged).and_then(|h| {
        if input.abandoned.load(Ordering::Acquire) {
            return Err(Refused("the collection was abandoned".into()));
        }
        staged
            .commit()
            .map_err(|e| Refused(format!("keeping the artifacts in the blob store: {e}")))?;
        Ok(h)
    });
    let Some(ch) = input.channel else {
        return gathered;
    };
    // Abandoned, the run has ended without it and its `artifact/` was set
    // aside then (`supervisor::disk`): the one there now may be a resumed
    // run's, and is not this collection's to touch.
    if input.abandoned.load(Ordering::Acquire) {
        return gathered;
    }
    let keep: BTreeSet<String> = match &gathered {
        Ok(h) => h.output.artifacts.iter().map(|a| a.name.clone()).collect(),
        Err(_) => BTreeSet::new(),
    };
    if let Err(e) = clear::clear(ch, &keep) {
        tracing::warn!(channel = %ch.display(), error = %e, "emptying artifact/ of what was not recorded");
    }
    let mut out = gathered?;
    out.pack_artifacts =
        pack_artifacts(&out.pack_refs, &out.output.artifacts, Some(ch), input.blobs);
    Ok(out)
}

/// [`harvest`] up to the blobs: the refs checked, the artifacts staged.
fn gather(input: &Input<'_>, staged: &mut Staged) -> Result<Harvest, Refused> {
    let (refs, checks) = check_refs(input.refs, input.channel.is_some(), input.policy)?;
    let mut out = Harvest::default();
    out.output.refs = refs.iter().map(|r| format!("{r}\n")).collect();
    out.pack_refs = refs.iter().map(pack_ref).collect();
    if checks.is_empty() && input.channel.is_none() {
        return Ok(out);
    }
    let channel = match input.channel {
        Some(ch) => Some(
            open::channel_dir(ch)
                .map_err(|e| Refused(format!("opening the channel {}: {e}", ch.display())))?,
        ),
        None => None,
    };
    let targets = checks.iter().map(|c| c.target.clone()).collect();
    let cap = ArtifactCap::of(input.policy);
    let rx = open::spawn_opener(input.confinement.clone(), channel, targets, cap.clone())
        .map_err(|e| Refused(format!("collecting the result: starting the opener: {e}")))?;
    let gone = || Refused("collecting the result: the opener stopped without an answer".into());
    for c in &checks {
        let opened = match rx.recv().map_err(|_| gone())? {
            open::Got::Ref(line, o) if line == c.target.line => o,
            open::Got::Failed(why) => {
                return Err(Refused(format!("collecting the result: {why}")));
            }
            _ => return Err(gone()),
        };
        let bad = |why: String| {
            Refused(format!(
                "refs.jsonl line {}: {}: {why}",
                c.target.line, c.given
            ))
        };
        let mut o = opened.map_err(&bad)?;
        let (got, _) = open::hash_copy(&mut o.file, MAX_REF_BYTES, None)
            .map_err(|e| bad(format!("reading it: {e}")))?;
        // The refusal never shows the digest: the child names the hash it
        // believes, and learns only that it is wrong.
        if !got.eq_ignore_ascii_case(&c.want) {
            return Err(bad("`hash` does not match its content".into()));
        }
    }
    let mut artifacts = Vec::new();
    let mut total = 0u64;
    loop {
        match rx.recv().map_err(|_| gone())? {
            open::Got::Artifact(name, mut o) => {
                let left = cap.bytes.saturating_sub(total);
                let (sha256, size) = staged
                    .stage(&mut o.file, left)
                    .map_err(|e| Refused(format!("artifact/{name}: {e}")))?;
                total += size;
                artifacts.push(Artifact { name, sha256, size });
            }
            open::Got::End => break,
            open::Got::Failed(why) => return Err(Refused(why)),
            open::Got::Ref(..) => return Err(gone()),
        }
    }
    artifacts.sort_by(|a, b| a.name.cmp(&b.name));
    out.output.artifacts = artifacts;
    Ok(out)
}

/// The parent's context pack for a child whose output is recorded (a child
/// another node ran, issue 15): as [`harvest`] builds it, from the refs'
/// lines and the artifacts as the channel holds them. An artifact's content
/// is inlined when its blob is in `blobs`.
pub fn recorded(output: ChannelOutput, channel: Option<&Path>, blobs: &Path) -> Harvest {
    let refs: Vec<Value> = output
        .refs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Harvest {
        pack_refs: refs.iter().map(pack_ref).collect(),
        pack_artifacts: pack_artifacts(&refs, &output.artifacts, channel, blobs),
        output,
    }
}

/// The artifacts the refs name, for the context pack (none for a root,
/// which has no channel).
fn pack_artifacts(
    refs: &[Value],
    artifacts: &[Artifact],
    channel: Option<&Path>,
    blobs: &Path,
) -> Vec<Value> {
    let Some(channel) = channel else {
        return Vec::new();
    };
    refs.iter()
        .filter_map(artifact_named)
        .filter_map(|n| artifacts.iter().find(|a| a.name == n))
        .map(|a| pack_artifact(a, channel, &blob_path(blobs, &a.sha256)))
        .collect()
}

/// A ref whose hash must be checked: where its file is, the line's `path` as
/// given (for messages) and the digest it claims.
#[derive(Debug, Clone)]
pub struct HashCheck {
    target: open::RefTarget,
    given: String,
    want: String,
}

/// The refs of a `done` result, each checked and normalised (SPEC 4): `path`
/// and `summary` required, single line; `id` generated when absent (`ref-<line>`,
/// so a rebuild writes the same); `kind` one of [`REF_KINDS`], default `file`;
/// `hash`, when present, `sha256:<64 hex>`, to be checked against the file's
/// ([`harvest`] does, opening it as the child). A relative `path` is relative
/// to the channel directory (`artifact/x` names an artifact); an absolute one
/// is checked only where the child's policy lets it read.
pub fn check_refs(
    refs: &[Value],
    has_channel: bool,
    policy: &Policy,
) -> Result<(Vec<Value>, Vec<HashCheck>), Refused> {
    let mut out = Vec::with_capacity(refs.len());
    let mut checks = Vec::new();
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
            let file = resolve(&path, has_channel, policy).map_err(&bad)?;
            checks.push(HashCheck {
                target: open::RefTarget { line, path: file },
                given: path.clone(),
                want: want.to_owned(),
            });
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
    Ok((out, checks))
}

/// Where a ref's file is, for its hash: relative paths inside the channel
/// directory (never above it; returned relative to it); absolute ones only
/// where the child may read.
fn resolve(path: &str, has_channel: bool, policy: &Policy) -> Result<PathBuf, String> {
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
    if !has_channel {
        return Err(format!(
            "a relative path ({path}) names a file of the parent's channel, and a root has none"
        ));
    }
    relative(path).ok_or_else(|| format!("{path:?} must stay inside the channel (no `..`)"))
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::fs::File;

    fn operator() -> Policy {
        Policy::operator(0, 0, Default::default())
    }

    fn unconfined() -> Confinement {
        Confinement {
            sandbox: None,
            ids: None,
        }
    }

    fn run(refs: &[Value], ch: Option<&Path>, blobs: &Path) -> Result<Harvest, Refused> {
        run_as(&operator(), refs, ch, blobs, &AtomicBool::new(false))
    }

    fn run_as(
        policy: &Policy,
        refs: &[Value],
        ch: Option<&Path>,
        blobs: &Path,
        abandoned: &AtomicBool,
    ) -> Result<Harvest, Refused> {
        harvest(&Input {
            refs,
            channel: ch,
            policy,
            blobs,
            confinement: unconfined(),
            abandoned,
        })
    }

    /// Every file in the blob store, temp files included.
    fn blob_files(blobs: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(blobs.join("sha256"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn artifact_dir(ch: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(ch.join("artifact"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn sha256_of(p: &Path) -> String {
        let mut f = File::open(p).unwrap();
        open::hash_copy(&mut f, u64::MAX, None).unwrap().0
    }

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    const SOME_HASH: &str =
        "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

    #[test]
    fn refs_are_normalised_with_defaults() {
        let refs = vec![json!({"path": "src/a.rs", "summary": "the parser", "extra": 1})];
        let (out, checks) = check_refs(&refs, true, &operator()).unwrap();
        assert!(checks.is_empty());
        assert_eq!(
            out[0].to_string(),
            r#"{"id":"ref-1","kind":"file","path":"src/a.rs","summary":"the parser","extra":1}"#
        );
    }

    #[test]
    fn each_bad_line_is_named() {
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
            let e = check_refs(&[ok.clone(), bad.clone()], true, &operator())
                .unwrap_err()
                .0;
            assert!(e.starts_with("refs.jsonl line 2: "), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e} lacks {why}");
        }
    }

    #[test]
    fn a_hash_is_checked_against_the_file_and_a_mismatch_shows_no_digest() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        fs::create_dir_all(ch.join("artifact")).unwrap();
        fs::write(ch.join("artifact/out.txt"), "hello\n").unwrap();
        let r = json!({"path": "artifact/out.txt", "summary": "s", "hash": SOME_HASH});
        assert!(run(&[r], Some(&ch), &blobs).is_ok());
        let bad = format!("sha256:{}", "a".repeat(64));
        let r = json!({"path": "artifact/out.txt", "summary": "s", "hash": bad});
        let e = run(&[r], Some(&ch), &blobs).unwrap_err().0;
        assert!(e.contains("does not match") && e.contains("line 1"), "{e}");
        assert!(!e.contains(&SOME_HASH[7..]), "the real digest leaked: {e}");
    }

    /// What a hostile child plants instead of a file: each is refused at once,
    /// naming the line and what it is, and nothing is read.
    #[test]
    fn a_ref_that_is_not_a_plain_regular_file_is_refused_without_reading() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        let secret_dir = d.path().join("secret");
        fs::create_dir(&secret_dir).unwrap();
        fs::write(secret_dir.join("s.txt"), "hello\n").unwrap();
        std::os::unix::fs::symlink(&secret_dir, d.path().join("outside-link")).unwrap();
        // Planted again before each case: a refusal empties artifact/.
        let plant = || {
            fs::create_dir_all(ch.join("artifact")).unwrap();
            mkfifo(&ch.join("artifact/fifo"));
            std::os::unix::fs::symlink(&secret_dir, ch.join("artifact/dir")).unwrap();
            let sparse = ch.join("artifact/sparse");
            File::create(&sparse).unwrap().set_len(10 << 30).unwrap();
        };
        let abs_link = d.path().join("outside-link/s.txt");
        let cases = [
            ("/dev/zero".to_owned(), "a character device"),
            ("artifact/fifo".to_owned(), "a FIFO"),
            ("artifact/dir/s.txt".to_owned(), "symbolic link"),
            (abs_link.display().to_string(), "symbolic link"),
            ("artifact/sparse".to_owned(), "10737418240 bytes"),
            ("artifact".to_owned(), "a directory"),
        ];
        for (path, why) in cases {
            plant();
            let r = json!({"path": path, "summary": "s", "hash": SOME_HASH});
            let e = run(&[r], Some(&ch), &blobs).unwrap_err().0;
            assert!(
                e.starts_with(&format!("refs.jsonl line 1: {path}: ")) && e.contains(why),
                "{path}: {e}"
            );
            assert!(!e.contains(&SOME_HASH[7..20]), "{e}");
            assert_eq!(
                artifact_dir(&ch),
                Vec::<String>::new(),
                "{path}: left behind"
            );
        }
        assert_eq!(
            fs::read_to_string(secret_dir.join("s.txt")).unwrap(),
            "hello\n",
            "what a link pointed at stays"
        );
    }

    #[test]
    fn artifacts_go_to_the_blob_store_and_links_fifos_and_devices_are_not_taken() {
        let d = tempfile::tempdir().unwrap();
        let ch = d.path().join("ch");
        fs::create_dir_all(ch.join("artifact/sub")).unwrap();
        fs::write(ch.join("artifact/a.txt"), "alpha").unwrap();
        fs::write(ch.join("artifact/sub/b.txt"), "beta").unwrap();
        fs::write(d.path().join("secret"), "secret").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), ch.join("artifact/link")).unwrap();
        std::os::unix::fs::symlink(d.path(), ch.join("artifact/dirlink")).unwrap();
        mkfifo(&ch.join("artifact/fifo"));
        let blobs = d.path().join("blobs");
        let refs = vec![json!({"path": "artifact/a.txt", "summary": "the a", "kind": "artifact"})];
        let h = run(&refs, Some(&ch), &blobs).unwrap();
        let names: Vec<_> = h.output.artifacts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a.txt", "sub/b.txt"]);
        for a in &h.output.artifacts {
            let bytes = fs::read(blob_path(&blobs, &a.sha256)).unwrap();
            assert_eq!(bytes.len() as u64, a.size);
            assert_eq!(sha256_of(&blob_path(&blobs, &a.sha256)), a.sha256);
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

    #[test]
    fn artifacts_past_the_bounds_are_refused_naming_the_bound() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        let mut deep = ch.join("artifact");
        for i in 0..MAX_DEPTH + 1 {
            deep.push(format!("d{i}"));
        }
        fs::create_dir_all(&deep).unwrap();
        let e = run(&[], Some(&ch), &blobs).unwrap_err().0;
        assert!(e.contains("deeper than"), "{e}");

        fs::remove_dir_all(ch.join("artifact")).unwrap();
        fs::create_dir_all(ch.join("artifact")).unwrap();
        File::create(ch.join("artifact/big"))
            .unwrap()
            .set_len(MAX_ARTIFACT_BYTES + 1)
            .unwrap();
        let e = run(&[], Some(&ch), &blobs).unwrap_err().0;
        assert!(
            e.contains(&format!("exceed {MAX_ARTIFACT_BYTES} bytes")),
            "{e}"
        );
        // Nothing of it reached the blob store.
        let kept = fs::read_dir(blobs.join("sha256"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(kept, 0);
    }

    /// Issue 24: the artifacts together are bounded by the child's
    /// `disk_max`; a result refused after some of them were copied leaves
    /// no blob, whole or temp, and an empty `artifact/`.
    #[test]
    fn a_result_over_disk_max_is_refused_and_leaves_nothing_behind() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        fs::create_dir_all(ch.join("artifact/sub")).unwrap();
        fs::write(ch.join("artifact/a"), "123456").unwrap();
        fs::write(ch.join("artifact/b"), "abcdef").unwrap();
        fs::write(ch.join("artifact/sub/c"), "xyz").unwrap();
        let mut small = operator();
        small.resources.disk_max = Some(10);
        let e = run_as(&small, &[], Some(&ch), &blobs, &AtomicBool::new(false))
            .unwrap_err()
            .0;
        assert_eq!(
            e,
            "the artifacts exceed resources.disk_max, 10 bytes (at artifact/b)"
        );
        assert_eq!(blob_files(&blobs), Vec::<String>::new());
        assert_eq!(artifact_dir(&ch), Vec::<String>::new());
    }

    /// Accepted, `artifact/` keeps what was recorded and nothing else: a
    /// link and a FIFO, which are not artifacts, go.
    #[test]
    fn an_accepted_result_keeps_only_its_recorded_artifacts() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        fs::create_dir_all(ch.join("artifact/sub")).unwrap();
        fs::write(ch.join("artifact/a.txt"), "alpha").unwrap();
        fs::write(ch.join("artifact/sub/b.txt"), "beta").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", ch.join("artifact/link")).unwrap();
        mkfifo(&ch.join("artifact/fifo"));
        let mut roomy = operator();
        roomy.resources.disk_max = Some(1 << 20);
        let h = run_as(&roomy, &[], Some(&ch), &blobs, &AtomicBool::new(false)).unwrap();
        assert_eq!(h.output.artifacts.len(), 2);
        assert_eq!(artifact_dir(&ch), ["a.txt", "sub"]);
        assert_eq!(
            fs::read_to_string(ch.join("artifact/sub/b.txt")).unwrap(),
            "beta"
        );
        assert_eq!(blob_files(&blobs).len(), 2, "{:?}", blob_files(&blobs));
    }

    /// A collection the supervisor stopped waiting for keeps nothing in the
    /// blob store, even when it would have been accepted, and leaves
    /// `artifact/` alone (the supervisor set the run's aside when it ended
    /// it; what is there now may be a resumed run's).
    #[test]
    fn an_abandoned_collection_keeps_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (ch, blobs) = (d.path().join("ch"), d.path().join("blobs"));
        fs::create_dir_all(ch.join("artifact")).unwrap();
        fs::write(ch.join("artifact/a.txt"), "alpha").unwrap();
        let e = run_as(&operator(), &[], Some(&ch), &blobs, &AtomicBool::new(true))
            .unwrap_err()
            .0;
        assert!(e.contains("abandoned"), "{e}");
        assert_eq!(blob_files(&blobs), Vec::<String>::new());
        assert_eq!(artifact_dir(&ch), ["a.txt"]);
    }
}
