-- The worker's own table: orders, each written with the fence token of the worker that paid
-- it. Install it next to pgcoord's tables (pgcoord migrate up), in the same schema.
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    total_cents bigint NOT NULL,
    status      text   NOT NULL DEFAULT 'new',
    fence_token bigint -- the token of the lease grant that last wrote the row
);
