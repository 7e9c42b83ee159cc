package semaphore

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AdmissionsWaiting returns how many admissions (with the default commit mode) wait behind
// one in flight on pool.
func AdmissionsWaiting(pool *pgxpool.Pool) int {
	return admissions.Waiting(fmt.Sprintf("%p\x00", pool))
}

// Lanes is how many batches of admissions may be in flight on a pool at once.
const Lanes = lanes
