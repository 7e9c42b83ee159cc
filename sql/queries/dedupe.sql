-- name: DedupeClaim :execrows
INSERT INTO pgcoord_dedupe (scope, key, claimed_at, expires_at)
VALUES (@scope::text, @key::text, coalesce(sqlc.narg('now')::timestamptz, now()), sqlc.narg('expires_at')::timestamptz)
ON CONFLICT (scope, key) DO NOTHING;

-- name: DedupeGC :execrows
DELETE FROM pgcoord_dedupe
WHERE ctid = ANY (ARRAY(
    SELECT d.ctid FROM pgcoord_dedupe d
    WHERE d.expires_at <= coalesce(sqlc.narg('now')::timestamptz, now())
    LIMIT @batch::int));
