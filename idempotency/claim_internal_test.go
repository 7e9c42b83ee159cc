package idempotency

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// A key the claim would answer from its plain read — completed, another request's
// (another fingerprint), held by a live attempt — is answered by claimSQL's own read,
// without calling pgcoord_idempotency_claim; a new key, or one whose holder's lease
// lapsed, goes to the claim. So does a batch of claims (IdempotencyClaimMany). Each case
// runs in a transaction of the test's that counts the function's calls (track_functions).
func TestClaimAnswersWhatItCanWithoutTheFunction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Direct(t, pgtest.Pool(t))
	clock := pgtest.NewClock(t, pool)
	lease, retention := dbarg.Interval(time.Minute), dbarg.Interval(time.Hour)
	// counted runs fn in a transaction and returns the function's calls fn made.
	counted := func(fn func(tx pgx.Tx)) int64 {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SET LOCAL track_functions = 'all'`); err != nil {
			t.Fatal(err)
		}
		// The backend's calls not yet reported, which may include its earlier transactions':
		// nothing is reported while a transaction runs, so the difference is fn's.
		count := func() (n int64) {
			if err := tx.QueryRow(ctx, `SELECT coalesce(pg_stat_get_xact_function_calls(
				'pgcoord_idempotency_claim(text, text, bytea, text, interval, interval)'::regprocedure), 0)`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := count()
		fn(tx)
		calls := count() - before
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return calls
	}
	claim := func(key, fp, holder string) (calls int64, state, gotHolder string) {
		t.Helper()
		calls = counted(func(tx pgx.Tx) {
			if err := tx.QueryRow(ctx, `SELECT k.state, k.holder FROM (`+claimSQL+`) k`, "s", key, []byte(fp), holder, retention, lease).
				Scan(&state, &gotHolder); err != nil {
				t.Fatalf("claim of %s: %v", key, err)
			}
		})
		return calls, state, gotHolder
	}
	if calls, state, holder := claim("done", "fp", "h1"); calls != 1 || state != StateInFlight || holder != "h1" {
		t.Fatalf("a new key: %d calls of the function, %s held by %s; want 1, in_flight, h1", calls, state, holder)
	}
	if _, err := pool.Exec(ctx, `SELECT pgcoord_idempotency_complete('s', 'done', 'h1', 200, '{}', 'ok')`); err != nil {
		t.Fatal(err)
	}
	if calls, state, holder := claim("live", "fp", "h2"); calls != 1 || state != StateInFlight || holder != "h2" {
		t.Fatalf("another new key: %d calls of the function, %s held by %s; want 1, in_flight, h2", calls, state, holder)
	}
	for _, c := range []struct {
		name, key, fp string
		wantCalls     int64
		wantState     string
		wantHolder    string
	}{
		{"a completed key (a replay)", "done", "fp", 0, StateCompleted, "h1"},
		{"a completed key of another request", "done", "other", 0, StateCompleted, "h1"},
		{"a live attempt's key", "live", "fp", 0, StateInFlight, "h2"},
		{"a live attempt's key, another request", "live", "other", 0, StateInFlight, "h2"},
	} {
		if calls, state, holder := claim(c.key, c.fp, "h3"); calls != c.wantCalls || state != c.wantState || holder != c.wantHolder {
			t.Errorf("%s: %d calls of the function, %s held by %s; want %d, %s, %s", c.name, calls, state, holder, c.wantCalls, c.wantState, c.wantHolder)
		}
	}

	// A batch: the completed key and the live one are answered by the read, the new key
	// goes to the claim.
	var got []string
	calls := counted(func(tx pgx.Tx) {
		rows, err := queries.IdempotencyClaimMany(ctx, tx, dbsqlc.IdempotencyClaimManyParams{
			LockTimeout: coalesce.LockTimeout, Scopes: []string{"s", "s", "s"}, Keys: []string{"done", "live", "new"},
			Fingerprints: [][]byte{[]byte("fp"), []byte("fp"), []byte("fp")}, Holders: []string{"h4", "h4", "h4"},
			Retentions: []pgtype.Interval{retention, retention, retention}, Leases: []pgtype.Interval{lease, lease, lease},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			got = append(got, fmt.Sprintf("%d %s %s %s", r.I, r.Key, r.State, r.Holder))
		}
	})
	want := []string{"1 done completed h1", "2 live in_flight h2", "3 new in_flight h4"}
	if calls != 1 || !slices.Equal(got, want) {
		t.Errorf("a batch: %d calls of the function, rows %q; want 1, %q", calls, got, want)
	}

	clock.Advance(2 * time.Minute) // the live attempt's lease lapses: the claim takes it over
	if calls, state, holder := claim("live", "fp", "h3"); calls != 1 || state != StateInFlight || holder != "h3" {
		t.Errorf("a lapsed attempt's key: %d calls of the function, %s held by %s; want 1, in_flight, h3", calls, state, holder)
	}
}
