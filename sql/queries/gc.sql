-- Retention (00008_gc.sql): one batch of every kind per call.

-- name: GC :many
SELECT g.kind::text AS kind, g.removed::bigint AS removed
FROM pgcoord_gc(@older_than::interval, @batch::int, @dry_run::boolean) g;
