//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

// The leader worker: a process that campaigns for leaderLease with a leases.Elector and,
// while it leads, writes to leader_writes every EVERY, each write fenced by the lease's
// token (fenced.Check on leaderResource in the write's transaction).

const (
	leaderRole     = "leader.elect"
	leaderLease    = "leader"
	leaderResource = "leader-resource"
)

func init() { workerRoles[leaderRole] = leaderWorker }

// leaderSchema is the table the leaders write. Every write runs fenced.Check first, which
// locks the fence register's row until the write commits: writes are serialized, so the
// order of ids (allocated after the check) is the commit order.
const leaderSchema = `CREATE TABLE leader_writes (
	id     bigserial   PRIMARY KEY,
	worker text        NOT NULL,
	token  bigint      NOT NULL,
	at     timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// leaderWrite is one fenced write of the leader.
func leaderWrite(ctx context.Context, pool *pgxpool.Pool, worker string, token int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := fenced.Check(ctx, tx, leaderResource, token); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO leader_writes (worker, token) VALUES ($1, $2)`, worker, token); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// leaderWorker campaigns until told "quit" on stdin (or stdin closes). Parameters: NAME
// (its holder identity), TTL, POLL (the elector's PollInterval), EVERY (between writes).
//
// It says:
//   - "ready" once it campaigns;
//   - "leading <token> <acquired_at> <expires_at>" (database clock, Unix microseconds) each
//     time it is elected;
//   - "stale <token>" when a write of its term was refused by the fence (it then returns
//     from OnStartedLeading: the elector resigns and campaigns again);
//   - "stopped <token> <cause>" when its term ended and it noticed;
//   - "zombie <stale|wrote|error> <token>" after "zombie" on stdin: one write with the token
//     of its last term, whatever it believes now — the write of a holder that woke up from
//     a pause;
//   - "bye" when Run returned after "quit".
//
// A leader looks at its term's context only after each write, like code that does not check
// it in time: after a pause it writes once more before it can notice the loss.
func leaderWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	ttl, err := time.ParseDuration(w.Param("TTL"))
	if err != nil {
		return err
	}
	poll, err := time.ParseDuration(w.Param("POLL"))
	if err != nil {
		return err
	}
	every, err := time.ParseDuration(w.Param("EVERY"))
	if err != nil {
		return err
	}
	var last atomic.Int64 // the token of the latest term
	e, err := leases.NewElector(w.Pool, &leases.ElectorConfig{
		Name: leaderLease, TTL: ttl, PollInterval: poll, Holder: name,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		OnStartedLeading: func(termCtx context.Context, l leases.Lease) {
			last.Store(l.Token)
			w.Say("leading %d %d %d", l.Token, l.AcquiredAt.UnixMicro(), l.ExpiresAt.UnixMicro())
			for {
				// The write uses the process's context, not the term's: a write already
				// under way when the term ends completes, or is fenced.
				err := leaderWrite(ctx, w.Pool, name, l.Token)
				switch {
				case errors.Is(err, fenced.ErrStale):
					w.Say("stale %d", l.Token)
					return
				case err != nil && ctx.Err() == nil:
					fmt.Fprintf(os.Stderr, "write with token %d: %v\n", l.Token, err)
				}
				if termCtx.Err() != nil {
					w.Say("stopped %d %s", l.Token, strings.ReplaceAll(fmt.Sprint(context.Cause(termCtx)), " ", "_"))
					return
				}
				<-time.After(every)
			}
		},
	})
	if err != nil {
		return err
	}
	runCtx, resign := context.WithCancel(ctx)
	defer resign()
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	w.Say("ready")
	for {
		cmd, err := w.Next()
		if err != nil || cmd == "quit" { // an error: the test is gone
			break
		}
		if cmd != "zombie" {
			return fmt.Errorf("unknown command %q", cmd)
		}
		token := last.Load()
		switch err := leaderWrite(ctx, w.Pool, name, token); {
		case errors.Is(err, fenced.ErrStale):
			w.Say("zombie stale %d", token)
		case err != nil:
			w.Say("zombie error %d", token)
			fmt.Fprintf(os.Stderr, "zombie write: %v\n", err)
		default:
			w.Say("zombie wrote %d", token)
		}
	}
	resign()
	select {
	case err := <-done:
		w.Say("bye")
		return err
	case <-time.After(30 * time.Second):
		return errors.New("Run did not return within 30s of resigning")
	}
}
