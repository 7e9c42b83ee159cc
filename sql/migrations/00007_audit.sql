-- The audit log of operator actions taken from the dashboard (`pgcoord ui --allow-actions`):
-- who did what to which target, when by the database clock. A row is written in the same
-- transaction as the action it records, so an action that rolled back leaves no row and
-- an action that committed always has one. `pgcoord audit list` reads it.

-- +goose Up
CREATE TABLE pgcoord_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- at is the database clock of the action's transaction.
    at          timestamptz NOT NULL DEFAULT pgcoord_now(),
    -- actor is who acted: the CLI's --actor, or the dashboard's signed-in operator.
    actor       text        NOT NULL CHECK (octet_length(actor) BETWEEN 1 AND 255),
    -- remote_addr is the client address the request came from.
    remote_addr text        NOT NULL DEFAULT '',
    -- action names what was done (lease.expire, semaphore.set_limit, ...).
    action      text        NOT NULL CHECK (octet_length(action) BETWEEN 1 AND 100),
    -- target is what it was done to (a lease name, a semaphore key, ...).
    target      text        NOT NULL CHECK (octet_length(target) <= 1000),
    -- details holds the action's parameters and what it changed.
    details     jsonb       NOT NULL DEFAULT '{}'
);

CREATE INDEX pgcoord_audit_by_at ON pgcoord_audit (at);

COMMENT ON TABLE pgcoord_audit IS 'pgcoord: operator actions taken from the dashboard, newest last';

-- +goose Down
DROP TABLE pgcoord_audit;
