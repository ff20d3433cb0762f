-- An Idempotency-Key is its caller's own (issue 24; SQLite's migration 12):
-- a reply is kept under (tenant, caller, key), so the same key from two
-- callers are two keys. The caller of a kept reply is the first word of its
-- scope (`<caller> <METHOD> <path>`).
ALTER TABLE idempotency ADD COLUMN caller TEXT;
UPDATE idempotency SET caller = split_part(scope, ' ', 1);
ALTER TABLE idempotency ALTER COLUMN caller SET NOT NULL;
ALTER TABLE idempotency DROP CONSTRAINT idempotency_pkey;
ALTER TABLE idempotency ADD PRIMARY KEY (tenant, caller, key);
