//! How much of the disk a running child's `artifact/` takes (issue 24 item
//! 6): measured on each sweeper tick, off the dispatcher, so a child that
//! writes many files each under its `RLIMIT_FSIZE` is stopped once they add
//! up past its `disk_max`, rather than at collection.
//!
//! The child runs while it is measured, so the walk only looks: it opens
//! directories beneath `artifact/` without following links and `fstatat`s
//! each entry without following it; it reads no file. Each entry counts what
//! it takes on disk, the larger of its size and its allocated blocks, and at
//! least [`ENTRY_COST`] (an inode and a directory entry are not free), so
//! neither one sparse giant nor a million empty files passes unseen. The
//! walk is bounded: past [`MAX_ENTRIES`] entries or [`super::MAX_DEPTH`]
//! directories deep it stops and says so, which stops the child too (no
//! collection would take such a tree: at most [`super::MAX_ARTIFACTS`]
//! files are).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{MAX_ARTIFACTS, MAX_DEPTH};

/// What each entry counts at least: one block of the usual 4 KiB.
pub const ENTRY_COST: u64 = 4096;

/// The most entries one measure looks at: ten times what a collection
/// takes, so only a tree no result could hand back reaches it.
pub const MAX_ENTRIES: u64 = 10 * MAX_ARTIFACTS as u64;

/// Why a child's `artifact/` is over what it may hold, in words that name the
/// limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over(pub String);

/// Measures `channel/artifact` against `limit` bytes: `Ok` with the bytes
/// counted (a missing directory is 0), or why it is over. The walk ends as
/// soon as the count passes `limit`.
pub fn check(channel: &Path, limit: u64) -> Result<u64, Over> {
    let root = match rustix::fs::open(
        channel.join("artifact"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(Errno::NOENT) => return Ok(0),
        Err(e) => return Err(unmeasurable("artifact/", e)),
    };
    let mut m = Measure {
        bytes: 0,
        entries: 0,
        limit,
    };
    m.dir(&root, "artifact", 0)?;
    Ok(m.bytes)
}

struct Measure {
    bytes: u64,
    entries: u64,
    limit: u64,
}

impl Measure {
    fn dir(&mut self, dir: &OwnedFd, shown: &str, depth: usize) -> Result<(), Over> {
        let listing = Dir::read_from(dir).map_err(|e| unmeasurable(shown, e))?;
        for e in listing {
            let e = e.map_err(|e| unmeasurable(shown, e))?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(Over(format!(
                    "artifact/ holds more than {MAX_ENTRIES} entries (a result hands back at \
                     most {MAX_ARTIFACTS} files)"
                )));
            }
            // Gone meanwhile: the child may remove what it wrote.
            let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(unmeasurable(shown, e)),
            };
            let size = u64::try_from(st.st_size).unwrap_or(0);
            let blocks = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
            self.bytes = self.bytes.saturating_add(size.max(blocks).max(ENTRY_COST));
            if self.bytes > self.limit {
                return Err(Over(format!(
                    "artifact/ takes more than resources.disk_max, {} bytes",
                    self.limit
                )));
            }
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                let sub_shown = format!("{shown}/{}", name.to_string_lossy());
                if depth + 1 >= MAX_DEPTH {
                    return Err(Over(format!(
                        "{sub_shown} is nested deeper than {MAX_DEPTH} directories"
                    )));
                }
                let sub = match rustix::fs::openat2(
                    dir.as_fd(),
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH,
                ) {
                    Ok(d) => d,
                    // Removed, or swapped for something else, meanwhile.
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                    Err(e) => return Err(unmeasurable(&sub_shown, e)),
                };
                self.dir(&sub, &sub_shown, depth + 1)?;
            }
        }
        Ok(())
    }
}

/// A directory the supervisor cannot look into (the child gave it mode 000
/// under a supervisor without `CAP_DAC_OVERRIDE`): what is in it cannot be
/// bounded, so it counts as over.
fn unmeasurable(shown: &str, e: Errno) -> Over {
    Over(format!(
        "{shown} cannot be measured against resources.disk_max: {}",
        std::io::Error::from(e)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn files_add_up_and_each_entry_costs_a_block() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(check(d.path(), 1), Ok(0), "no artifact/ is nothing");
        let a = d.path().join("artifact");
        fs::create_dir_all(a.join("sub")).unwrap();
        fs::write(a.join("one"), vec![1u8; 10_000]).unwrap();
        fs::write(a.join("sub/two"), vec![2u8; 10_000]).unwrap();
        let used = check(d.path(), 1 << 20).unwrap();
        // Two files of 10,000 bytes (12 KiB of blocks each, or 10,000 bytes
        // where the filesystem packs them) and a directory.
        assert!((20_000 + ENTRY_COST..=3 * 12_288).contains(&used), "{used}");
        let Over(why) = check(d.path(), 15_000).unwrap_err();
        assert_eq!(
            why,
            "artifact/ takes more than resources.disk_max, 15000 bytes"
        );
        // A sparse file counts its size, though it takes no blocks.
        fs::File::create(a.join("sparse"))
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert!(check(d.path(), 1 << 30).is_err());
        fs::remove_file(a.join("sparse")).unwrap();
        // Empty files are not free.
        for i in 0..300 {
            fs::write(a.join(format!("e{i}")), "").unwrap();
        }
        assert!(check(d.path(), 300 * ENTRY_COST).is_err());
    }

    #[test]
    fn a_tree_past_the_walks_bounds_is_over() {
        let d = tempfile::tempdir().unwrap();
        let mut deep = d.path().join("artifact");
        for _ in 0..MAX_DEPTH + 1 {
            deep.push("d");
        }
        fs::create_dir_all(&deep).unwrap();
        let Over(why) = check(d.path(), u64::MAX).unwrap_err();
        assert!(why.contains("nested deeper than 32"), "{why}");
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("artifact");
        fs::create_dir(&a).unwrap();
        for i in 0..=MAX_ENTRIES {
            fs::write(a.join(format!("e{i}")), "").unwrap();
        }
        let Over(why) = check(d.path(), u64::MAX).unwrap_err();
        assert!(why.contains("more than 10000 entries"), "{why}");
        // A link is counted as itself, never followed.
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("artifact");
        fs::create_dir(&a).unwrap();
        std::os::unix::fs::symlink("/usr", a.join("usr")).unwrap();
        assert_eq!(check(d.path(), 1 << 20), Ok(ENTRY_COST));
    }
}
