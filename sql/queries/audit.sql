-- The audit log of operator actions (00007_audit.sql).

-- name: InsertAudit :one
INSERT INTO pgcoord_audit (actor, remote_addr, action, target, details)
VALUES (@actor::text, @remote_addr::text, @action::text, @target::text, @details::jsonb)
RETURNING *;

-- name: ListAudit :many
-- Newest first; before_id pages backwards (0: from the newest).
SELECT a.* FROM pgcoord_audit a
WHERE (@before_id::bigint = 0 OR a.id < @before_id::bigint)
  AND (sqlc.narg('action')::text IS NULL OR a.action = sqlc.narg('action')::text)
  AND starts_with(a.target, @target_prefix::text)
ORDER BY a.id DESC
LIMIT @max_rows::int;
