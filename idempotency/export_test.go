package idempotency

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClaimsWaiting returns how many claims of non-Atomic attempts wait behind one in flight
// on pool.
func ClaimsWaiting(pool *pgxpool.Pool) int {
	return claims.Waiting(fmt.Sprintf("%p\x00", pool))
}
