package leases

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AcquiresWaiting returns how many TryAcquire calls (with the default commit mode) wait
// behind one in flight on pool.
func AcquiresWaiting(pool *pgxpool.Pool) int {
	return acquires.Waiting(fmt.Sprintf("%p\x00", pool))
}

// Lanes is how many batches of a kind may be in flight on a pool at once.
const Lanes = lanes
