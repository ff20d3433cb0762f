-- The nodes sharing this store (issue 15), as SQLite's migration 8.
CREATE TABLE nodes (
    id           TEXT   NOT NULL PRIMARY KEY,
    address      TEXT   NOT NULL,
    labels       TEXT   NOT NULL,
    capacity     BIGINT CHECK (capacity IS NULL OR capacity >= 0),
    started_ms   BIGINT NOT NULL,
    heartbeat_ms BIGINT NOT NULL
);
