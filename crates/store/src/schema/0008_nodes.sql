-- The nodes sharing this store (issue 15): each `brood serve` registers
-- itself at start, heartbeats on its tick and removes its row when it stops.
-- A node's load is counted from `agents.supervisor`, not stored.
CREATE TABLE nodes (
    id           TEXT    NOT NULL PRIMARY KEY,
    address      TEXT    NOT NULL,
    labels       TEXT    NOT NULL,
    capacity     INTEGER CHECK (capacity IS NULL OR capacity >= 0),
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL
) STRICT;
