//! Planner statistics kept true while the tables are young (issue 27).
//!
//! A prepared statement is planned for its parameters five times, then
//! given a generic plan that the connection keeps until the tables it reads
//! are analyzed again. On a new database that plan is made while the tables
//! are nearly empty: every index that starts with the tenant looks as good
//! as the one the statement needs, and a run's start then scanned every run
//! of the tenant to find one by its id. Each agent made the next one's
//! statements slower (one node's creations fell from 293 a second for 300
//! agents to 159 for 3,000), and autovacuum's first analyze comes a minute
//! or more later, when its daemon next visits the database.
//!
//! Planning every execution instead (`plan_cache_mode`) was measured and
//! not kept: half of the server's time went to the planner. So the store
//! analyzes, itself, the tables that grow with the agents, once any of them
//! is more than twice the size its statistics were taken at: looked at each
//! time this store's admissions pass a power of two from 64 on, on a thread
//! of its own, so no admission waits for it. An analyze invalidates the plans made
//! on the old statistics, on every node's connections. On a database whose
//! statistics are true, the look finds nothing to do.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Pool;

/// The tables that grow with every agent, which the hot statements read.
const GROWING: &[&str] = &["agents", "runs", "events", "edges"];

/// The first look, in admissions: below it a plan's choice hardly matters.
const FIRST_LOOK: u64 = 64;

/// Which of the tables are more than twice the size their statistics were
/// taken at (or were never analyzed and hold a page): their names. Sizes in
/// pages, read from the files, since the server's counts of live rows reach
/// its statistics views only seconds later.
const Q_STALE: &str = "SELECT c.relname::TEXT FROM pg_class c \
     WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' \
     AND c.relname = ANY($1) \
     AND pg_relation_size(c.oid) / current_setting('block_size')::BIGINT \
         > CASE WHEN c.reltuples < 0 THEN 0 ELSE 2 * c.relpages END";

/// The admissions committed through this store.
#[derive(Default)]
pub(crate) struct Young {
    admitted: AtomicU64,
}

impl Young {
    /// `n` more admissions committed through this store: past a power of
    /// two from [`FIRST_LOOK`] on, the tables are looked at (and analyzed
    /// where stale) on a thread of their own.
    pub(crate) fn admitted(&self, n: u64, pool: &Arc<Pool>) {
        if n == 0 {
            return;
        }
        let before = self.admitted.fetch_add(n, Ordering::Relaxed);
        let after = before + n;
        if after < FIRST_LOOK || before.max(FIRST_LOOK - 1).ilog2() == after.ilog2() {
            return;
        }
        let pool = Arc::clone(pool);
        let spawned = std::thread::Builder::new()
            .name("brood-store-analyze".into())
            .spawn(move || {
                if let Err(e) = analyze_stale(&pool) {
                    // Only the plans' speed depends on it: autovacuum
                    // analyzes in its own time.
                    eprintln!("brood store: analyzing the growing tables failed: {e}");
                }
            });
        if let Err(e) = spawned {
            eprintln!("brood store: no thread to analyze the growing tables: {e}");
        }
    }
}

/// Analyzes each growing table whose statistics are stale.
fn analyze_stale(pool: &Pool) -> crate::types::Result<()> {
    pool.with(|c| {
        let db = c.db();
        let stale: Vec<String> = db
            .query(Q_STALE, &[&GROWING])?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        if !stale.is_empty() {
            // The names are this module's own, never a caller's.
            db.batch(&format!("ANALYZE {}", stale.join(", ")))?;
        }
        Ok(())
    })
}
