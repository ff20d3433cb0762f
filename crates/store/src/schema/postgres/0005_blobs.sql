-- The bytes of artifacts shared between nodes (issue 15, `Blobs`): a blob's
-- chunks first, each in a transaction of its own, then its head, which
-- makes it readable. A blob is kept as long as the records naming it.
CREATE TABLE blob_chunks (
    tenant TEXT   NOT NULL,
    sha256 TEXT   NOT NULL,
    seq    BIGINT NOT NULL,
    bytes  BYTEA  NOT NULL,
    PRIMARY KEY (tenant, sha256, seq)
);
-- Kept uncompressed: artifacts are often compressed files already, and a
-- second try at 1 MiB a chunk costs the server CPU for little.
ALTER TABLE blob_chunks ALTER COLUMN bytes SET STORAGE EXTERNAL;
CREATE TABLE blobs (
    tenant     TEXT   NOT NULL,
    sha256     TEXT   NOT NULL,
    size       BIGINT NOT NULL,
    chunks     BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, sha256)
);
