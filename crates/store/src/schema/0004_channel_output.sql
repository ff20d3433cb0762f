-- Migration 4: what a child hands back besides `result.md` (SPEC 4).
--
-- `refs` is the channel's `refs.jsonl`, exactly as the runtime validated and
-- wrote it (one JSON object per line), so a rebuild writes the same bytes.
-- `artifacts` is a JSON array of `{"name","sha256","size"}`: each file the child
-- left in its `artifact/` directory, taken into the content-addressed blob store
-- (`$BROOD_ROOT/blobs/sha256/<hex>`), so the directory can be rebuilt too.
-- Both are NULL until a run ends with a result, and cleared when a resume
-- starts the next run, like `result`.
ALTER TABLE channels ADD COLUMN refs TEXT;
ALTER TABLE channels ADD COLUMN artifacts TEXT;
