package pgcoord

import (
	"context"
	"fmt"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// LockKey returns the 64-bit advisory-lock key pgcoord uses for name: the value of the SQL
// function pgcoord_lock_key(name), which hashes the name together with the schema pgcoord
// is installed in. Use it to take pgcoord-compatible advisory locks in your own SQL, or
// call pgcoord_lock_key directly there. It returns an error wrapping ErrInvalidName for a
// bad name, before any SQL runs.
func LockKey(ctx context.Context, db DBTX, name string) (int64, error) {
	if err := check.Name("lock", name); err != nil {
		return 0, err
	}
	key, err := queries.LockKey(ctx, db, name)
	if err != nil {
		return 0, fmt.Errorf("pgcoord: lock key for %q: %w", name, err)
	}
	return key, nil
}

var queries dbsqlc.Queries
