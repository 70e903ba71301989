-- idem 0007: a blob store of its own (`PgBlobs`), for response bodies kept
-- by reference instead of in their record.
--
-- A blob is a head row (its owner: the record and fence that wrote it)
-- and its bytes in chunks. The head is written first, unfinished; the
-- chunks follow, each committed; `finished` is set last, and only a
-- finished blob is read. A write cut off leaves an unfinished head and its
-- chunks, which the sweep removes (the chunks go with their head).

CREATE TABLE IF NOT EXISTS {schema}.idem_blobs (
    locator     text        PRIMARY KEY,
    owner_scope text        NOT NULL,
    owner_key   text        NOT NULL,
    owner_fence bigint      NOT NULL,
    finished    boolean     NOT NULL DEFAULT false,
    modified    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {schema}.idem_blob_chunks (
    locator text    NOT NULL REFERENCES {schema}.idem_blobs (locator) ON DELETE CASCADE,
    seq     integer NOT NULL,
    data    bytea   NOT NULL,
    PRIMARY KEY (locator, seq)
);
