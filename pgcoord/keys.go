package pgcoord

import (
	"context"
	"fmt"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
)

// LockKey returns the 64-bit advisory-lock key pgcoord uses for name: the value of the SQL
// function pgcoord_lock_key(name), which hashes the name together with the schema pgcoord
// is installed in. Use it to take advisory locks of your own that two schemas never share,
// or call pgcoord_lock_key directly there. Anyone can compute such a key (the schema and
// the name are no secret) and any login can hold it, so a lock on it excludes only
// cooperating sessions: pgcoord's own primitives no longer lock keys of pgcoord_lock_key
// (singleton.RunOnce locks a secret, per-run key instead). It returns an error wrapping ErrInvalidName for a
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
