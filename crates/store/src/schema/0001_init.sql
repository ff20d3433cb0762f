-- Migration 1: the first schema of brood's store (SPEC 14).
--
-- Every table is STRICT so a value of the wrong type is refused instead of being
-- stored and misread later. Statuses are `Status::encode` text and outcomes
-- `Terminal::encode` text, so the database can be read by people and by `sqlite3`.
-- Timestamps are milliseconds since the Unix epoch, as the caller's clock gave them.
-- Nothing is ever deleted (SPEC: "history is never lost"), so foreign keys never
-- block a delete; they are here to catch a writer that forgets a row.
--
-- "Unfinished" is spelled exactly as in `sqlite.rs` (the `unfinished!` macro):
--     status IN ('queued', 'running', 'blocked') OR status LIKE 'stopping/%'
-- SQLite uses a partial index only when the query repeats its WHERE expression,
-- so the two spellings must stay identical.

CREATE TABLE tenants (
    id         TEXT    NOT NULL PRIMARY KEY,
    -- The sequence number the tenant's next event gets; read and advanced in the
    -- same transaction as the change the events describe, so it has no gaps.
    next_seq   INTEGER NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    created_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE agents (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    name       TEXT    NOT NULL,
    parent     TEXT,
    customer   TEXT,
    root       TEXT    NOT NULL,
    depth      INTEGER NOT NULL CHECK (depth >= 0),
    session    TEXT    NOT NULL,
    protocol   TEXT    NOT NULL CHECK (protocol IN ('brood', 'exec')),
    spec       TEXT    NOT NULL,
    status     TEXT    NOT NULL,
    detail     TEXT,
    -- The newest run. Not a foreign key: the agent row is written before its first
    -- run, and runs already point back at their agent.
    run        TEXT    NOT NULL,
    supervisor TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, name),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, customer) REFERENCES agents (tenant, name)
) STRICT;

-- Children of an agent in creation order; also what a fanout count reads.
CREATE INDEX agents_by_parent ON agents (tenant, parent, created_ms, name);
-- Every agent ever created under a root: what a tree-size quota counts (SPEC 9).
CREATE INDEX agents_by_root ON agents (tenant, root);
-- A tenant's agents in creation order (`brood ps -a`).
CREATE INDEX agents_by_created ON agents (tenant, created_ms, name);
-- Unfinished agents are few next to finished ones after a while; these two
-- partial indexes keep start-up recovery and `brood ps` from reading history.
CREATE INDEX agents_unfinished_by_supervisor ON agents (supervisor)
    WHERE status IN ('queued', 'running', 'blocked') OR status LIKE 'stopping/%';
CREATE INDEX agents_unfinished_by_tenant ON agents (tenant, created_ms, name)
    WHERE status IN ('queued', 'running', 'blocked') OR status LIKE 'stopping/%';

-- The durable parent-child edges; the parent-death plan walks them. WITHOUT ROWID:
-- the primary key is the whole row, so the walk reads one b-tree.
CREATE TABLE edges (
    tenant     TEXT    NOT NULL,
    parent     TEXT    NOT NULL,
    child      TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, parent, child),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, child) REFERENCES agents (tenant, name)
) STRICT, WITHOUT ROWID;

CREATE INDEX edges_by_child ON edges (tenant, child);

CREATE TABLE runs (
    id         TEXT    NOT NULL PRIMARY KEY,
    tenant     TEXT    NOT NULL,
    agent      TEXT    NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    pid        INTEGER,
    cgroup     TEXT,
    outcome    TEXT,
    exit_code  INTEGER,
    result     TEXT,
    tokens_in  INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost_usd   REAL    NOT NULL DEFAULT 0,
    started_ms INTEGER,
    ended_ms   INTEGER,
    created_ms INTEGER NOT NULL,
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
) STRICT;

CREATE UNIQUE INDEX runs_by_agent ON runs (tenant, agent, seq);

-- The parent's channel to a child (SPEC 4). Its status is not stored: it is the
-- child's status seen through `Status::abi`, so the two can never disagree.
CREATE TABLE channels (
    tenant         TEXT NOT NULL,
    parent         TEXT NOT NULL,
    parent_session TEXT NOT NULL,
    child          TEXT NOT NULL,
    child_session  TEXT NOT NULL,
    handoff        TEXT NOT NULL,
    result         TEXT,
    PRIMARY KEY (tenant, parent, child),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, child) REFERENCES agents (tenant, name)
) STRICT;

-- Events, numbered per tenant without gaps. WITHOUT ROWID: they are read in
-- (tenant, seq) order, which is then the order on disk.
CREATE TABLE events (
    tenant  TEXT    NOT NULL REFERENCES tenants (id),
    seq     INTEGER NOT NULL,
    ts_ms   INTEGER NOT NULL,
    agent   TEXT    NOT NULL,
    run     TEXT,
    session TEXT    NOT NULL,
    kind    TEXT    NOT NULL,
    payload TEXT    NOT NULL,
    PRIMARY KEY (tenant, seq),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
) STRICT, WITHOUT ROWID;

CREATE INDEX events_by_agent ON events (tenant, agent, seq);

-- Whole transcript messages; `seq` is the position in the session, from 1.
CREATE TABLE messages (
    tenant  TEXT    NOT NULL,
    agent   TEXT    NOT NULL,
    session TEXT    NOT NULL,
    seq     INTEGER NOT NULL CHECK (seq >= 1),
    run     TEXT    NOT NULL REFERENCES runs (id),
    role    TEXT    NOT NULL,
    content TEXT    NOT NULL,
    ts_ms   INTEGER NOT NULL,
    PRIMARY KEY (tenant, agent, session, seq),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
) STRICT;
