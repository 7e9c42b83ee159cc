-- name: DedupeClaim :execrows
-- expires_at is claimed_at + retention, by the database clock; NULL retention keeps the claim.
INSERT INTO pgcoord_dedupe (scope, key, claimed_at, expires_at)
VALUES (@scope::text, @key::text, pgcoord_now(),
        pgcoord_now() + sqlc.narg('retention')::interval)
ON CONFLICT (scope, key) DO NOTHING;

-- name: DedupeGC :execrows
DELETE FROM pgcoord_dedupe
WHERE ctid = ANY (ARRAY(
    SELECT d.ctid FROM pgcoord_dedupe d
    WHERE d.expires_at <= pgcoord_now()
    LIMIT @batch::int))
  AND expires_at <= pgcoord_now();

-- name: DedupeCountExpired :one
SELECT count(*) FROM pgcoord_dedupe
WHERE expires_at <= pgcoord_now();
