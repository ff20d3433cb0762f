-- Migration 6: the HTTP API's idempotency keys (SPEC 11).
--
-- A mutation sent with an `Idempotency-Key` keeps its first answer here, so a
-- repeat (a client retrying after a lost reply, or after the daemon
-- restarted) gets that answer without the mutation being done again. The
-- key is the tenant's; `scope` (caller, method, path) and `request_hash`
-- tell a true repeat from a different request that reuses the key.
CREATE TABLE idempotency (
    tenant       TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    scope        TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    status       INTEGER NOT NULL CHECK (status BETWEEN 100 AND 599),
    body         TEXT    NOT NULL,
    created_ms   INTEGER NOT NULL,
    expires_ms   INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;

-- Expired keys are forgotten by the tenant's next write of a key.
CREATE INDEX idempotency_expiry ON idempotency (tenant, expires_ms);
