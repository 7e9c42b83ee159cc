package singleton_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// Behind PgBouncer in transaction mode RunSession detects the pooler and refuses with
// ErrPooler, without running fn and without leaving the session lock held on the server
// connection it landed on — never a lock that looks held and is not.
func TestRunSessionBehindPoolerRefuses(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	for range 3 { // each time on whichever server connection the pooler picks
		called := false
		ran, err := singleton.RunSession(ctx, pool, "rebuild", func(context.Context) error { called = true; return nil }, nil)
		if ran || called || !errors.Is(err, pgcoord.ErrPooler) {
			t.Fatalf("RunSession behind a pooler = (%v, %v), fn called %v; want (false, ErrPooler)", ran, err, called)
		}
		if pid := lockHolder(ctx, t, pgtest.Direct(t, pool), "rebuild"); pid != 0 {
			t.Fatalf("server process %d holds the job's lock after RunSession refused", pid)
		}
	}
}

// RunOnce keeps no session state, so it works through the pooler: while one replica runs
// the job in its transaction, another replica's RunOnce skips it, and once the first
// commits the job can run again.
func TestRunOnceBehindPoolerExcludes(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	other := pgtest.NewPool(t, pgtest.URL(t), pool.Config().ConnConfig.Database) // another replica
	// A first run commits the job's generation row, which lockHolder reads from another
	// session: a first run's own row is not visible there until it commits.
	if ran, err := singleton.RunOnce(ctx, pool, "report", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("the first RunOnce = (%v, %v)", ran, err)
	}
	ran, err := singleton.RunOnce(ctx, pool, "report", func(ctx context.Context, _ pgx.Tx) error {
		if pid := lockHolder(ctx, t, pgtest.Direct(t, pool), "report"); pid == 0 {
			t.Error("nobody holds the job's lock while RunOnce runs it")
		}
		ranOther, err := singleton.RunOnce(ctx, other, "report", func(context.Context, pgx.Tx) error { return nil })
		if ranOther || err != nil {
			t.Errorf("the other replica's RunOnce = (%v, %v) while the job runs; want (false, nil)", ranOther, err)
		}
		return nil
	})
	if !ran || err != nil {
		t.Fatalf("RunOnce = (%v, %v)", ran, err)
	}
	if ran, err := singleton.RunOnce(ctx, other, "report", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("RunOnce after the first committed = (%v, %v), want it to run", ran, err)
	}
}
