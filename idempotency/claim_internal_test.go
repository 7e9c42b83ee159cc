package idempotency

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgcoord/pgcoord/internal/coalesce"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// A claim, alone or in a batch, commits without waiting for the WAL flush: the statement
// sets synchronous_commit off for its own transaction (here a transaction of the test's,
// to read the setting before it ends).
func TestClaimsCommitWithoutWaitingForTheFlush(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	fp := []byte("fp")
	lease, retention := dbarg.Interval(time.Minute), dbarg.Interval(time.Hour)
	for name, claim := range map[string]func(tx dbsqlc.DBTX) error{
		"alone": func(tx dbsqlc.DBTX) error {
			rows, err := tx.Query(ctx, claimSQL, "s", "alone", fp, "h", retention, lease)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			return err
		},
		"batch": func(tx dbsqlc.DBTX) error {
			_, err := queries.IdempotencyClaimMany(ctx, tx, dbsqlc.IdempotencyClaimManyParams{
				LockTimeout: coalesce.LockTimeout, Scopes: []string{"s", "s"}, Keys: []string{"b1", "b2"},
				Fingerprints: [][]byte{fp, fp}, Holders: []string{"h", "h"},
				Retentions: []pgtype.Interval{retention, retention}, Leases: []pgtype.Interval{lease, lease},
			})
			return err
		},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim(tx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var setting string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
			t.Fatal(err)
		}
		if setting != "off" {
			t.Errorf("%s: synchronous_commit %q after the claim, want off", name, setting)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
