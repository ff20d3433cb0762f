-- brood's store on PostgreSQL (SPEC 14): the same tables as the SQLite
-- schema after its migrations 1 to 7, in one file, with PostgreSQL's types:
-- every integer is BIGINT (the code reads and writes i64, as on SQLite),
-- every real DOUBLE PRECISION. Later changes are new numbered files.

CREATE TABLE tenants (
    id         TEXT   NOT NULL PRIMARY KEY,
    -- The sequence number the tenant's next event gets; read and advanced in
    -- the same transaction as the change the events describe, so it has no
    -- gaps, on one node or many.
    next_seq   BIGINT NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    created_ms BIGINT NOT NULL
);

CREATE TABLE agents (
    tenant     TEXT   NOT NULL REFERENCES tenants (id),
    name       TEXT   NOT NULL,
    parent     TEXT,
    customer   TEXT,
    root       TEXT   NOT NULL,
    depth      BIGINT NOT NULL CHECK (depth >= 0),
    session    TEXT   NOT NULL,
    protocol   TEXT   NOT NULL CHECK (protocol IN ('brood', 'exec')),
    spec       TEXT   NOT NULL,
    status     TEXT   NOT NULL,
    detail     TEXT,
    run        TEXT   NOT NULL,
    supervisor TEXT   NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, name),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, customer) REFERENCES agents (tenant, name)
);
CREATE INDEX agents_by_parent ON agents (tenant, parent, created_ms, name);
CREATE INDEX agents_by_root ON agents (tenant, root);
CREATE INDEX agents_by_created ON agents (tenant, created_ms, name);
CREATE INDEX agents_unfinished_by_supervisor ON agents (supervisor)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';
CREATE INDEX agents_unfinished_by_tenant ON agents (tenant, created_ms, name)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';
CREATE INDEX agents_unfinished_by_parent ON agents (tenant, parent, status)
    WHERE status = 'queued' OR status = 'running' OR status = 'blocked'
       OR status LIKE 'stopping/%';

CREATE TABLE edges (
    tenant     TEXT   NOT NULL,
    parent     TEXT   NOT NULL,
    child      TEXT   NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, parent, child),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, child) REFERENCES agents (tenant, name)
);
CREATE INDEX edges_by_child ON edges (tenant, child);

CREATE TABLE runs (
    id          TEXT   NOT NULL PRIMARY KEY,
    tenant      TEXT   NOT NULL,
    agent       TEXT   NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 1),
    pid         BIGINT,
    cgroup      TEXT,
    outcome     TEXT,
    exit_code   BIGINT,
    result      TEXT,
    tokens_in   BIGINT NOT NULL DEFAULT 0,
    tokens_out  BIGINT NOT NULL DEFAULT 0,
    cost_usd    DOUBLE PRECISION NOT NULL DEFAULT 0,
    started_ms  BIGINT,
    ended_ms    BIGINT,
    created_ms  BIGINT NOT NULL,
    deadline_ms BIGINT,
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
);
CREATE UNIQUE INDEX runs_by_agent ON runs (tenant, agent, seq);
CREATE INDEX runs_due ON runs (deadline_ms)
    WHERE deadline_ms IS NOT NULL AND ended_ms IS NULL;

CREATE TABLE channels (
    tenant         TEXT NOT NULL,
    parent         TEXT NOT NULL,
    parent_session TEXT NOT NULL,
    child          TEXT NOT NULL,
    child_session  TEXT NOT NULL,
    handoff        TEXT NOT NULL,
    result         TEXT,
    refs           TEXT,
    artifacts      TEXT,
    PRIMARY KEY (tenant, parent, child),
    FOREIGN KEY (tenant, parent) REFERENCES agents (tenant, name),
    FOREIGN KEY (tenant, child) REFERENCES agents (tenant, name)
);

CREATE TABLE events (
    tenant  TEXT   NOT NULL REFERENCES tenants (id),
    seq     BIGINT NOT NULL,
    ts_ms   BIGINT NOT NULL,
    agent   TEXT   NOT NULL,
    run     TEXT,
    session TEXT   NOT NULL,
    kind    TEXT   NOT NULL,
    payload TEXT   NOT NULL,
    PRIMARY KEY (tenant, seq),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
);
CREATE INDEX events_by_agent ON events (tenant, agent, seq);

CREATE TABLE messages (
    tenant  TEXT   NOT NULL,
    agent   TEXT   NOT NULL,
    session TEXT   NOT NULL,
    seq     BIGINT NOT NULL CHECK (seq >= 1),
    run     TEXT   NOT NULL REFERENCES runs (id),
    role    TEXT   NOT NULL,
    content TEXT   NOT NULL,
    ts_ms   BIGINT NOT NULL,
    PRIMARY KEY (tenant, agent, session, seq),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, name)
);

CREATE TABLE tenant_quotas (
    tenant TEXT   NOT NULL,
    key    TEXT   NOT NULL
        CHECK (key IN ('max_depth', 'max_fanout', 'max_tree_size', 'max_concurrent')),
    value  BIGINT NOT NULL CHECK (value BETWEEN 0 AND 4294967295),
    PRIMARY KEY (tenant, key)
);

CREATE TABLE leases (
    name        TEXT   NOT NULL PRIMARY KEY,
    holder      TEXT   NOT NULL,
    epoch       BIGINT NOT NULL CHECK (epoch >= 1),
    acquired_ms BIGINT NOT NULL
);

CREATE TABLE idempotency (
    tenant       TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    scope        TEXT   NOT NULL,
    request_hash TEXT   NOT NULL,
    status       BIGINT NOT NULL CHECK (status BETWEEN 100 AND 599),
    body         TEXT   NOT NULL,
    created_ms   BIGINT NOT NULL,
    expires_ms   BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_expiry ON idempotency (tenant, expires_ms);

CREATE TABLE jobs (
    tenant     TEXT   NOT NULL,
    id         TEXT   NOT NULL,
    owner      TEXT   NOT NULL,
    status     TEXT   NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    spec       TEXT   NOT NULL,
    source     TEXT,
    total      BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    started_ms BIGINT,
    ended_ms   BIGINT,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, id),
    FOREIGN KEY (tenant, owner) REFERENCES agents (tenant, name)
);
CREATE INDEX jobs_by_owner ON jobs (tenant, owner, created_ms);

CREATE TABLE job_items (
    tenant        TEXT   NOT NULL,
    job           TEXT   NOT NULL,
    id            TEXT   NOT NULL,
    row_index     BIGINT NOT NULL,
    input         TEXT   NOT NULL,
    status        TEXT   NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'reported')),
    attempts      BIGINT NOT NULL DEFAULT 0,
    last_error    TEXT,
    result        TEXT,
    worker        TEXT,
    not_before_ms BIGINT NOT NULL DEFAULT 0,
    completed_ms  BIGINT,
    updated_ms    BIGINT NOT NULL,
    PRIMARY KEY (tenant, job, id),
    FOREIGN KEY (tenant, job) REFERENCES jobs (tenant, id)
);
CREATE INDEX job_items_by_status ON job_items (tenant, job, status, row_index);

CREATE TABLE job_attempts (
    tenant     TEXT   NOT NULL,
    job        TEXT   NOT NULL,
    item       TEXT   NOT NULL,
    number     BIGINT NOT NULL,
    worker     TEXT,
    started_ms BIGINT NOT NULL,
    ended_ms   BIGINT,
    outcome    TEXT   NOT NULL CHECK (outcome IN ('running', 'completed', 'failed')),
    error      TEXT,
    PRIMARY KEY (tenant, job, item, number),
    FOREIGN KEY (tenant, job, item) REFERENCES job_items (tenant, job, id)
);
