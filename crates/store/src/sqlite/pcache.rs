//! How SQLite gets the memory of its page caches, set once a process before
//! its first connection (issue 27: reads never queue).
//!
//! By default every page cache SQLite makes takes its first 20 pages in one
//! block (`SQLITE_DEFAULT_PCACHE_INITSZ`, about 88 KiB) and writes a header
//! into each of them at once. A statement's temporary b-trees each get a
//! cache of their own: the recursive walks of the spend and admission
//! queries (`WITH RECURSIVE ... UNION`, `DISTINCT`) make three per run, so
//! every `GET /api/agents/:name` allocated about 260 KiB and freed it, glibc
//! gave it back to the kernel at the free (it is above its trim threshold),
//! and the next statement faulted every page in again: a profile of `brood
//! bench api` found a third of the reads' CPU in those page faults, and the
//! same read in-process ran three times faster without them. Without the
//! block, a cache takes its pages one at a time, as it uses them; glibc
//! keeps such small blocks for the next statement.

use std::sync::Once;

/// Turns the page caches' first block off, once, before SQLite starts. If
/// SQLite already started in this process (something opened a connection
/// first), it refuses, changes nothing, and the caches work as before:
/// slower, never wrong.
pub(super) fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `SQLITE_CONFIG_PAGECACHE` takes exactly a pointer and two
        // ints; a null pointer with no pages means "no block of our own,
        // and none in bulk". SQLite checks itself that it has not started
        // (`SQLITE_MISUSE` otherwise) and makes no other use of the values.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0 as std::ffi::c_int,
                0 as std::ffi::c_int,
            )
        };
        // Said once, on stderr: the store has no logger of its own.
        if rc != rusqlite::ffi::SQLITE_OK {
            eprintln!(
                "brood store: SQLite's page caches keep their bulk allocation \
                 (sqlite3_config answered {rc}: SQLite had started before the store opened)"
            );
        }
    });
}
