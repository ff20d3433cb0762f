-- The tenant's concurrency slots (SPEC 9) when the nodes sharing the store
-- share no Redis (issue 15): one share a supervisor, the slots its started
-- agents hold; the tenant's count is their sum (`SlotShares`).
CREATE TABLE slot_shares (
    tenant TEXT    NOT NULL,
    holder TEXT    NOT NULL,
    held   INTEGER NOT NULL,
    PRIMARY KEY (tenant, holder)
) STRICT;
