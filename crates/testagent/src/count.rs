//! Line counting for `--count-lines`: counting a file, walking a directory in
//! process, and listing a directory's entries for a fan-out.
//!
//! Only regular files and directories take part; symbolic links and special
//! files are skipped, so a walk can neither loop nor block on a FIFO. Entries
//! are visited in byte order of their names, so that the in-process walk and
//! the fan-out print the same lines in the same order.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// A directory entry worth counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The file name, lossily converted to text (used only for child names).
    pub name: String,
    pub path: PathBuf,
    pub is_dir: bool,
}

/// The regular files and directories directly in `dir`, sorted by name.
pub fn entries(dir: &Path) -> Result<Vec<Entry>, String> {
    let read_err = |e: io::Error| format!("cannot read directory {}: {e}", dir.display());
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        // `file_type` does not follow symlinks, which is what keeps walks finite.
        let ty = entry.file_type().map_err(read_err)?;
        if !(ty.is_file() || ty.is_dir()) {
            continue;
        }
        out.push(Entry {
            name: entry.file_name().to_string_lossy().into_owned(),
            path: entry.path(),
            is_dir: ty.is_dir(),
        });
    }
    out.sort_by(|a, b| a.path.file_name().cmp(&b.path.file_name()));
    Ok(out)
}

/// Lines of one file, read in pieces so a large file costs no memory.
pub fn count_file(path: &Path) -> Result<u64, String> {
    let fail = |e: io::Error| format!("cannot read {}: {e}", path.display());
    let mut file = fs::File::open(path).map_err(fail)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = 0;
    let mut last = None;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(e)),
        };
        // Only newlines per piece; a last line without one is added once, at
        // the end.
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
        last = Some(buf[n - 1]);
    }
    Ok(lines + u64::from(last.is_some_and(|b| b != b'\n')))
}

/// Counts `path` in process: a file gives `N\tPATH`; a directory gives
/// `N lines in PATH` followed by the lines of each entry, recursively.
/// `after_file` runs after each file (the agent sleeps and answers pings
/// there); its error stops the walk.
pub fn count_tree<E: From<String>>(
    path: &Path,
    after_file: &mut dyn FnMut() -> Result<(), E>,
) -> Result<(u64, Vec<String>), E> {
    let meta = fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_dir() {
        let n = count_file(path)?;
        after_file()?;
        return Ok((n, vec![format!("{n}\t{}", path.display())]));
    }
    let mut total = 0;
    let mut lines = Vec::new();
    for entry in entries(path)? {
        let (n, sub) = count_tree(&entry.path, after_file)?;
        total += n;
        lines.extend(sub);
    }
    lines.insert(0, format!("{total} lines in {}", path.display()));
    Ok((total, lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("brood-testagent-count-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("b.txt"), "1\n2\n3").unwrap();
        fs::write(root.join("a.txt"), "x\n").unwrap();
        fs::write(root.join("sub/c"), "").unwrap();
        fs::write(root.join("sub/d"), "1\n2\n").unwrap();
        std::os::unix::fs::symlink(&root, root.join("sub/loop")).unwrap();
        root
    }

    #[test]
    fn walks_a_tree_in_name_order_skipping_symlinks() {
        let root = tree();
        let mut files = 0;
        let (total, lines) = count_tree::<String>(&root, &mut || {
            files += 1;
            Ok(())
        })
        .unwrap();
        let r = root.display();
        assert_eq!(total, 6);
        assert_eq!(files, 4);
        assert_eq!(
            lines,
            vec![
                format!("6 lines in {r}"),
                format!("1\t{r}/a.txt"),
                format!("3\t{r}/b.txt"),
                format!("2 lines in {r}/sub"),
                format!("0\t{r}/sub/c"),
                format!("2\t{r}/sub/d"),
            ]
        );
        let names: Vec<_> = entries(&root)
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.is_dir))
            .collect();
        assert_eq!(
            names,
            vec![
                ("a.txt".into(), false),
                ("b.txt".into(), false),
                ("sub".into(), true)
            ]
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_last_line_without_newline_counts() {
        let f = std::env::temp_dir().join(format!("brood-testagent-lines-{}", std::process::id()));
        for (text, lines) in [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("\n\n", 2)] {
            fs::write(&f, text).unwrap();
            assert_eq!(count_file(&f).unwrap(), lines, "{text:?}");
        }
        let big = "x\n".repeat(100_000) + "tail";
        fs::write(&f, big).unwrap();
        assert_eq!(count_file(&f).unwrap(), 100_001, "across read pieces");
        fs::remove_file(&f).unwrap();
    }

    #[test]
    fn errors_name_the_path() {
        let e = count_tree::<String>(Path::new("/nonexistent/brood"), &mut || Ok(())).unwrap_err();
        assert!(e.contains("/nonexistent/brood"), "{e}");
    }
}
