-- name: FenceCheck :one
SELECT f.* FROM pgcoord_fence_check(@resource::text, @fence_token::bigint) f;

-- name: GetFence :one
SELECT sqlc.embed(f) FROM pgcoord_fences f WHERE f.resource = @resource::text;
