-- name: LockKey :one
SELECT pgcoord_lock_key(@name::text)::bigint AS key;
