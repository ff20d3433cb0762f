-- The foreign keys of the rows an admission writes beside its agent (its
-- run, edge, channel and events) go: seven checks an admission, they cost
-- about as much as the rest of its writes together (measured: 2,000-2,150 admissions a second across three nodes with them,
-- 2,850-3,150 without; docs/decisions/store.md "Admission on PostgreSQL, a
-- group at a time").
--
-- What they guarded still holds without them: these rows are written only
-- by the store's own transactions, each of which has checked, under the
-- tenant's lock, that the agent they name exists (an admission decides on
-- it; an event's agents are looked up before the insert; a run is made for
-- an agent just read); and no agent row is ever deleted (history is never
-- lost), so a reference once right stays right. The tree itself keeps its
-- keys: an agent's tenant, parent and customer.
ALTER TABLE edges DROP CONSTRAINT edges_tenant_parent_fkey;
ALTER TABLE edges DROP CONSTRAINT edges_tenant_child_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_tenant_agent_fkey;
ALTER TABLE channels DROP CONSTRAINT channels_tenant_parent_fkey;
ALTER TABLE channels DROP CONSTRAINT channels_tenant_child_fkey;
ALTER TABLE events DROP CONSTRAINT events_tenant_fkey;
ALTER TABLE events DROP CONSTRAINT events_tenant_agent_fkey;
