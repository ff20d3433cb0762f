-- Inputs for an agent that another node runs (issue 15): the node a request
-- reached writes them here, the agent's host takes them in order and
-- delivers them as its own (`Nodes::post_input`, `Nodes::take_inputs`).
CREATE TABLE inbox (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant     TEXT   NOT NULL,
    host       TEXT   NOT NULL,
    agent      TEXT   NOT NULL,
    sender     TEXT   NOT NULL,
    text       TEXT   NOT NULL,
    created_ms BIGINT NOT NULL
);
CREATE INDEX inbox_by_host ON inbox (host, tenant, id);
