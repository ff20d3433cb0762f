-- The bytes of artifacts shared between nodes (issue 15, `Blobs`): a blob's
-- chunks first, each in a transaction of its own, then its head, which
-- makes it readable. A blob is kept as long as the records naming it.
-- A rowid table: its rows are up to 1 MiB, far past what a WITHOUT ROWID
-- table keeps well.
CREATE TABLE blob_chunks (
    tenant TEXT    NOT NULL,
    sha256 TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    bytes  BLOB    NOT NULL,
    PRIMARY KEY (tenant, sha256, seq)
) STRICT;
CREATE TABLE blobs (
    tenant     TEXT    NOT NULL,
    sha256     TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    chunks     INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, sha256)
) STRICT;
