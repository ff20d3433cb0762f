-- Migration 3: budgets' and sweepers' bookkeeping (SPEC 9).
--
-- A run's deadline: its start plus the agent's `timeout_s`, written by `start_run`
-- so the timeouts sweeper finds overdue runs through an index instead of reading
-- every live agent's policy each second. The partial index holds only runs that
-- have a deadline and have not ended, so it stays as small as the live set.
ALTER TABLE runs ADD COLUMN deadline_ms INTEGER;
CREATE INDEX runs_due ON runs (deadline_ms)
    WHERE deadline_ms IS NOT NULL AND ended_ms IS NULL;

-- Leases: who runs the sweepers when several supervisors share the store. The
-- exclusive right itself is an operating-system lock (a file lock next to the
-- SQLite file); this row numbers each taking of it. `epoch` only grows, and every
-- write a sweeper makes checks, in its own transaction, that the row still names
-- its holder and epoch: a holder that lost its lock (paused, then overtaken) is
-- fenced off instead of racing the new one.
CREATE TABLE leases (
    name        TEXT    NOT NULL PRIMARY KEY,
    holder      TEXT    NOT NULL,
    epoch       INTEGER NOT NULL CHECK (epoch >= 1),
    acquired_ms INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
