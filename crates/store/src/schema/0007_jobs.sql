-- Migration 7: jobs (SPEC 10): one instruction over many items, run by
-- worker agents, each item with every attempt kept.
--
-- A job belongs to its owner agent (its workers are the owner's children).
-- An item's `attempts` counts the attempts made; the current attempt is the
-- row of `job_attempts` with that number, and only its worker may report
-- (the fencing token). An attempt row is never rewritten once it ended.
CREATE TABLE jobs (
    tenant      TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    spec        TEXT    NOT NULL,
    source      TEXT,
    total       INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    started_ms  INTEGER,
    ended_ms    INTEGER,
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, id),
    FOREIGN KEY (tenant, owner) REFERENCES agents (tenant, name)
) WITHOUT ROWID;

CREATE INDEX jobs_by_owner ON jobs (tenant, owner, created_ms);

CREATE TABLE job_items (
    tenant        TEXT    NOT NULL,
    job           TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    row_index     INTEGER NOT NULL,
    input         TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'reported')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    result        TEXT,
    worker        TEXT,
    not_before_ms INTEGER NOT NULL DEFAULT 0,
    completed_ms  INTEGER,
    updated_ms    INTEGER NOT NULL,
    PRIMARY KEY (tenant, job, id),
    FOREIGN KEY (tenant, job) REFERENCES jobs (tenant, id)
) WITHOUT ROWID;

-- The next items to assign, in input order; and the counts by status.
CREATE INDEX job_items_by_status ON job_items (tenant, job, status, row_index);

CREATE TABLE job_attempts (
    tenant      TEXT    NOT NULL,
    job         TEXT    NOT NULL,
    item        TEXT    NOT NULL,
    number      INTEGER NOT NULL,
    worker      TEXT,
    started_ms  INTEGER NOT NULL,
    ended_ms    INTEGER,
    outcome     TEXT    NOT NULL CHECK (outcome IN ('running', 'completed', 'failed')),
    error       TEXT,
    PRIMARY KEY (tenant, job, item, number),
    FOREIGN KEY (tenant, job, item) REFERENCES job_items (tenant, job, id)
) WITHOUT ROWID;
