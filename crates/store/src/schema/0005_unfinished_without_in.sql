-- Migration 5: "unfinished" spelled without an IN list.
--
-- The partial indexes of migrations 1 and 2 were written
--     WHERE status IN ('queued', 'running', 'blocked') OR status LIKE 'stopping/%'
-- SQLite evaluates an IN list of more than two constants through a temporary
-- b-tree it builds on each run of a statement (a new pager and page cache, so
-- fresh memory and page faults). Every write of an agent row evaluates the
-- WHERE of each of its three partial indexes, so every status change built
-- several of them: a measured 0.2 to 0.5 ms on each admission, start and end.
-- A chain of equalities is the same set, tested in place.
--
-- The spelling must stay identical to the `unfinished!` macro in sqlite.rs:
-- SQLite uses a partial index only when the query repeats its WHERE expression.
-- The indexes keep their names, columns and purpose (see 0001 and 0002).

DROP INDEX agents_unfinished_by_supervisor;
DROP INDEX agents_unfinished_by_tenant;
DROP INDEX agents_unfinished_by_parent;

CREATE INDEX agents_unfinished_by_supervisor ON agents (supervisor)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';
CREATE INDEX agents_unfinished_by_tenant ON agents (tenant, created_ms, name)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';
CREATE INDEX agents_unfinished_by_parent ON agents (tenant, parent, status)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';
