-- Migration 12: an Idempotency-Key is its caller's own (issue 24).
--
-- Keys were the tenant's: an agent could send, first, the key the operator
-- was about to use, and the operator's request was then refused with a 422
-- naming the agent's. Now a reply is kept under (tenant, caller, key), so
-- the same key from two callers are two keys. The caller of a kept reply is
-- the first word of its scope (`<caller> <METHOD> <path>`).
CREATE TABLE idempotency_by_caller (
    tenant       TEXT    NOT NULL,
    caller       TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    scope        TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    status       INTEGER NOT NULL CHECK (status BETWEEN 100 AND 599),
    body         TEXT    NOT NULL,
    created_ms   INTEGER NOT NULL,
    expires_ms   INTEGER NOT NULL,
    PRIMARY KEY (tenant, caller, key)
) WITHOUT ROWID;

INSERT INTO idempotency_by_caller
    (tenant, caller, key, scope, request_hash, status, body, created_ms, expires_ms)
SELECT tenant,
       CASE WHEN instr(scope, ' ') > 0 THEN substr(scope, 1, instr(scope, ' ') - 1)
            ELSE scope END,
       key, scope, request_hash, status, body, created_ms, expires_ms
FROM idempotency;

DROP TABLE idempotency;
ALTER TABLE idempotency_by_caller RENAME TO idempotency;

-- Expired keys are forgotten by the tenant's next write of a key.
CREATE INDEX idempotency_expiry ON idempotency (tenant, expires_ms);
