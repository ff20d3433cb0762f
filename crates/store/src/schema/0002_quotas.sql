-- Migration 2: quotas (SPEC 9).
--
-- Tenant overrides of the platform's quota defaults, one row per overridden key.
-- The values are stored as the operator gave them, not clamped: the ceilings are
-- platform configuration, applied when the quotas are used, so raising a ceiling
-- later lets an override take effect without rewriting it. No foreign key to
-- `tenants`: a tenant's quotas may be set before its first agent exists, and a
-- `tenants` row is what the first admission creates.
-- The key list is checked here as well as in `brood_core::quota`, so a new key
-- comes with a migration (and an older build then refuses the newer file instead
-- of misreading it).
CREATE TABLE tenant_quotas (
    tenant TEXT    NOT NULL,
    key    TEXT    NOT NULL
        CHECK (key IN ('max_depth', 'max_fanout', 'max_tree_size', 'max_concurrent')),
    value  INTEGER NOT NULL CHECK (value BETWEEN 0 AND 4294967295),
    PRIMARY KEY (tenant, key)
) STRICT, WITHOUT ROWID;

-- The fanout quota counts a parent's unfinished children inside every admission.
-- `agents_by_parent` would reach every child ever created and read each row for
-- its status. This partial index holds only the unfinished ones, and `status` is
-- in it so the count is answered from the index alone: it reads the unfinished
-- children's entries (at most `max_fanout` while the quota holds) and no table
-- row, however much history the parent has. Its WHERE is the `unfinished!`
-- spelling of 0001_init.sql and sqlite.rs, which the count repeats exactly
-- (SQLite uses a partial index only then).
CREATE INDEX agents_unfinished_by_parent ON agents (tenant, parent, status)
    WHERE status IN ('queued', 'running', 'blocked') OR status LIKE 'stopping/%';
