//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

// The double-charge incident of the mission, with real processes. Per order, payment worker
// A takes the lease "order:<id>" with a short TTL and stalls (SIGSTOP: a stop-the-world
// pause it cannot notice) past the lease's expiry by the database clock; worker B, another
// process, takes the lease with a higher token and charges; then A wakes up (SIGCONT) still
// believing it holds the lease, and charges too.
//
//   - naive: the charge is an unconditional INSERT. Both charges land: the incident is real,
//     and a time-based lease alone cannot prevent it.
//   - fenced: the charge runs fenced.Check(order, token) first, in its transaction. A's
//     check finds B's higher token and returns fenced.ErrStale: exactly one charge, B's.
//   - guard: the payments table carries the guard trigger (fenced.InstallGuard) and the
//     charge is a raw UPDATE that sets fence_token with no check in its WHERE clause (a code
//     path that forgot fencing). The database refuses A's lower token with SQLSTATE PGC01:
//     exactly one charge, B's.

const (
	gcpauseRole = "gcpause.charge"
	// gcpauseTTL is A's lease: short, so that the test waits little for its expiry.
	gcpauseTTL = 400 * time.Millisecond
	// gcpauseStep bounds every single wait of the scenario: a line from a worker, an exit,
	// the lease's expiry, B's acquisition.
	gcpauseStep = 20 * time.Second
	// gcpauseParallel orders run at a time (each with its two worker processes).
	gcpauseParallel = 4
)

func init() { workerRoles[gcpauseRole] = chargeWorker }

// gcpauseSchema creates the tables the charge worker writes: charges (one row per charge,
// for naive and fenced) and payments (one row per order, charged by UPDATE, guarded by the
// fence trigger).
const gcpauseSchema = `
CREATE TABLE charges (
	id       bigserial PRIMARY KEY,
	order_id bigint NOT NULL,
	worker   text   NOT NULL,
	token    bigint NOT NULL
);
CREATE TABLE payments (
	order_id    bigint PRIMARY KEY,
	status      text   NOT NULL DEFAULT 'pending',
	worker      text,
	charges     int    NOT NULL DEFAULT 0,
	fence_token bigint NOT NULL DEFAULT 0
);`

func orderLease(order int64) string { return fmt.Sprintf("order:%d", order) }

// chargeWorker is a payment worker for one order. Parameters: ORDER, MODE (naive, fenced,
// guard), TTL, NAME (recorded with the charge) and ACQUIRE: "try" (leases.TryAcquire, says
// "held" if refused) or "wait" (leases.Acquire, bounded by WAIT). It says
// "acquired <token> <acquired_at> <expires_at>" (database clock, Unix microseconds), then
// waits for "go" on stdin and charges once, and says "charged", or "stale <reason>" when
// fencing refused the charge.
func chargeWorker(ctx context.Context, w *workerproc.Worker) error {
	order, err := strconv.ParseInt(w.Param("ORDER"), 10, 64)
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(w.Param("TTL"))
	if err != nil {
		return err
	}
	name := orderLease(order)
	var l leases.Lease
	switch w.Param("ACQUIRE") {
	case "try":
		l, err = leases.TryAcquire(ctx, w.Pool, name, ttl, nil)
		if errors.Is(err, leases.ErrHeld) {
			w.Say("held")
			return nil
		}
	case "wait":
		wait, perr := time.ParseDuration(w.Param("WAIT"))
		if perr != nil {
			return perr
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		l, err = leases.Acquire(actx, w.Pool, name, ttl, nil)
		cancel()
	default:
		return fmt.Errorf("ACQUIRE %q: want try or wait", w.Param("ACQUIRE"))
	}
	if err != nil {
		return err
	}
	w.Say("acquired %d %d %d", l.Token, l.AcquiredAt.UnixMicro(), l.ExpiresAt.UnixMicro())

	// Anything can happen here: the test may stop this process for as long as it likes.
	if err := w.Await("go"); err != nil {
		return err
	}

	who := w.Param("NAME")
	switch mode := w.Param("MODE"); mode {
	case "naive":
		// Redis-lock style: the holder believes the lease still protects it.
		if _, err := w.Pool.Exec(ctx, `INSERT INTO charges (order_id, worker, token) VALUES ($1, $2, $3)`, order, who, l.Token); err != nil {
			return err
		}
	case "fenced":
		tx, err := w.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		if err := fenced.Check(ctx, tx, name, l.Token); errors.Is(err, fenced.ErrStale) {
			w.Say("stale %s", strings.ReplaceAll(err.Error(), " ", "_"))
			return nil
		} else if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, worker, token) VALUES ($1, $2, $3)`, order, who, l.Token); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	case "guard":
		// No fence comparison in the WHERE clause: only the trigger stands in the way.
		tag, err := w.Pool.Exec(ctx, `UPDATE payments
			SET status = 'charged', worker = $2, charges = charges + 1, fence_token = $3
			WHERE order_id = $1`, order, who, l.Token)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == fenced.GuardSQLState {
			if !fenced.IsStale(err) {
				return fmt.Errorf("fenced.IsStale does not recognize the guard's error %v", err)
			}
			w.Say("stale %s", pgErr.Code)
			return nil
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("payment %d: updated %d rows, want 1", order, tag.RowsAffected())
		}
	default:
		return fmt.Errorf("MODE %q: want naive, fenced or guard", mode)
	}
	w.Say("charged")
	return nil
}

// grant is what a worker said it was granted.
type grant struct {
	token                 int64
	acquiredAt, expiresAt time.Time // database clock
}

func parseGrant(line string) (grant, error) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "acquired" {
		return grant{}, fmt.Errorf("malformed grant %q", line)
	}
	var n [3]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return grant{}, fmt.Errorf("malformed grant %q: %w", line, err)
		}
		n[i] = v
	}
	return grant{token: n[0], acquiredAt: time.UnixMicro(n[1]), expiresAt: time.UnixMicro(n[2])}, nil
}

// gcpauseRig is one test's database and the means to start charge workers on it.
type gcpauseRig struct {
	pool        *pgxpool.Pool
	url, schema string
}

func newGCPauseRig(t *testing.T) *gcpauseRig {
	t.Helper()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	r := &gcpauseRig{pool: pool, url: pgtest.URL(t)}
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&r.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, gcpauseSchema); err != nil {
		t.Fatal(err)
	}
	if err := fenced.InstallGuard(ctx, pool, "payments", "fence_token", nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// start starts a charge worker, which t's cleanup removes whatever happens.
func (r *gcpauseRig) start(t *testing.T, name, mode, acquire string, order int64) (*workerproc.Proc, error) {
	return startWorker(t, fmt.Sprintf("%s(order %d, %s)", name, order, mode), gcpauseRole, r.url, r.schema, map[string]string{
		"ORDER": strconv.FormatInt(order, 10), "MODE": mode, "TTL": gcpauseTTL.String(),
		"NAME": name, "ACQUIRE": acquire, "WAIT": gcpauseStep.String(),
	})
}

// acquired waits for w's grant.
func acquired(w *workerproc.Proc) (grant, error) {
	line, err := w.Expect(gcpauseStep, "acquired ", "held")
	if err != nil {
		return grant{}, err
	}
	if line == "held" {
		return grant{}, fmt.Errorf("worker %s was refused the lease", w.Name())
	}
	return parseGrant(line)
}

// waitExpired polls the lease until it is no longer held by the database clock, bounded by
// gcpauseStep, and returns what it last read.
func waitExpired(ctx context.Context, pool *pgxpool.Pool, name string) (leases.Info, error) {
	ctx, cancel := context.WithTimeout(ctx, gcpauseStep)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := leases.Get(ctx, pool, name)
		if err != nil {
			return info, err
		}
		if !info.Held() {
			return info, nil
		}
		select {
		case <-ctx.Done():
			return info, fmt.Errorf("%s still held %v after its holder stopped (expires %v, db now %v)",
				name, gcpauseStep, info.ExpiresAt, info.DBNow)
		case <-tick.C:
		}
	}
}

// pauseOutcome is one order of the pause scenario as the test saw it.
type pauseOutcome struct {
	order  int64
	a, b   grant
	aSaid  string // what A said after it woke up
	before leases.Info
}

// pauseOrder plays the incident for one order: A acquires, is stopped, its lease expires by
// the database clock, B acquires and charges, A is continued and charges.
func (r *gcpauseRig) pauseOrder(ctx context.Context, t *testing.T, mode string, order int64) (pauseOutcome, error) {
	out := pauseOutcome{order: order}
	a, err := r.start(t, "A", mode, "try", order)
	if err != nil {
		return out, err
	}
	if out.a, err = acquired(a); err != nil {
		return out, err
	}
	// The pause: A holds the lease and has not charged yet.
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		return out, err
	}
	if out.before, err = waitExpired(ctx, r.pool, orderLease(order)); err != nil {
		return out, err
	}
	b, err := r.start(t, "B", mode, "try", order)
	if err != nil {
		return out, err
	}
	if out.b, err = acquired(b); err != nil {
		return out, err
	}
	if err := b.Send("go"); err != nil {
		return out, err
	}
	if _, err := b.Expect(gcpauseStep, "charged"); err != nil {
		return out, err
	}
	if err := b.Wait(gcpauseStep); err != nil {
		return out, fmt.Errorf("worker %s: %w", b.Name(), err)
	}
	// A wakes up, still believing it holds the lease, and charges.
	if err := a.Signal(syscall.SIGCONT); err != nil {
		return out, err
	}
	if err := a.Send("go"); err != nil {
		return out, err
	}
	if out.aSaid, err = a.Expect(gcpauseStep, "charged", "stale"); err != nil {
		return out, err
	}
	if err := a.Wait(gcpauseStep); err != nil {
		return out, fmt.Errorf("worker %s: %w", a.Name(), err)
	}
	return out, nil
}

// forOrders runs fn for n orders numbered from first, gcpauseParallel at a time, and returns
// the outcomes in order; it fails t with every error.
func forOrders[T any](t *testing.T, first int64, n int, fn func(order int64) (T, error)) []T {
	t.Helper()
	out := make([]T, n)
	errs := make([]error, n)
	sem := make(chan struct{}, gcpauseParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = fn(first + int64(i))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("order %d: %v", first+int64(i), err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return out
}

func gcpauseOrders() int {
	if testing.Short() {
		return 5
	}
	return 20
}

// charge is a row of the charges table.
type charge struct {
	worker string
	token  int64
}

func chargesOf(ctx context.Context, t *testing.T, pool *pgxpool.Pool, order int64) []charge {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT worker, token FROM charges WHERE order_id = $1 ORDER BY id`, order)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []charge
	for rows.Next() {
		var c charge
		if err := rows.Scan(&c.worker, &c.token); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkTokens asserts the invariants every mode shares: the lease was still A's grant when
// it expired, and B's grant has a strictly higher token, granted no earlier than A's grant
// expired by the database clock.
func checkTokens(t *testing.T, o pauseOutcome) {
	t.Helper()
	if o.before.Token != o.a.token {
		t.Errorf("order %d: the lease expired with token %d, want A's %d", o.order, o.before.Token, o.a.token)
	}
	if o.b.token <= o.a.token {
		t.Errorf("order %d: B's token %d is not higher than A's %d", o.order, o.b.token, o.a.token)
	}
	if o.b.acquiredAt.Before(o.a.expiresAt) {
		t.Errorf("order %d: B was granted at %v, before A's grant expired at %v (database clock)", o.order, o.b.acquiredAt, o.a.expiresAt)
	}
}

// TestGCPauseDoubleCharge plays the incident over many orders in each mode and checks the
// whole history: without fencing every order is charged twice; with fencing (register or
// guard trigger) every order is charged exactly once, by B, with B's higher token, and A is
// told its token is stale.
func TestGCPauseDoubleCharge(t *testing.T) {
	t.Parallel()
	r := newGCPauseRig(t)
	ctx := t.Context()
	n := gcpauseOrders()

	t.Run("naive", func(t *testing.T) {
		outcomes := forOrders(t, 1000, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "naive", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if o.aSaid != "charged" {
				t.Errorf("order %d: A said %q after waking up, want charged", o.order, o.aSaid)
			}
			got := chargesOf(ctx, t, r.pool, o.order)
			want := []charge{{"B", o.b.token}, {"A", o.a.token}}
			if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
				t.Errorf("order %d: charges %v, want the double charge %v", o.order, got, want)
			}
		}
	})

	t.Run("fenced", func(t *testing.T) {
		outcomes := forOrders(t, 2000, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "fenced", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if !strings.HasPrefix(o.aSaid, "stale ") {
				t.Errorf("order %d: A said %q after waking up, want stale (fenced.ErrStale)", o.order, o.aSaid)
			}
			got := chargesOf(ctx, t, r.pool, o.order)
			if len(got) != 1 || got[0] != (charge{"B", o.b.token}) {
				t.Errorf("order %d: charges %v, want exactly one, by B with token %d", o.order, got, o.b.token)
			}
			var highest int64
			if err := r.pool.QueryRow(ctx, `SELECT fence_token FROM pgcoord_fences WHERE resource = $1`, orderLease(o.order)).Scan(&highest); err != nil {
				t.Fatal(err)
			}
			if highest != o.b.token {
				t.Errorf("order %d: the fence register holds %d, want B's token %d", o.order, highest, o.b.token)
			}
		}
	})

	t.Run("guard", func(t *testing.T) {
		const first = 3000
		if _, err := r.pool.Exec(ctx, `INSERT INTO payments (order_id) SELECT generate_series($1::bigint, $2::bigint)`, first, first+n-1); err != nil {
			t.Fatal(err)
		}
		outcomes := forOrders(t, first, n, func(order int64) (pauseOutcome, error) { return r.pauseOrder(ctx, t, "guard", order) })
		for _, o := range outcomes {
			checkTokens(t, o)
			if o.aSaid != "stale "+fenced.GuardSQLState {
				t.Errorf("order %d: A said %q after waking up, want the guard's refusal (stale %s)", o.order, o.aSaid, fenced.GuardSQLState)
			}
			var (
				status, worker string
				charges        int
				token          int64
			)
			if err := r.pool.QueryRow(ctx, `SELECT status, worker, charges, fence_token FROM payments WHERE order_id = $1`, o.order).
				Scan(&status, &worker, &charges, &token); err != nil {
				t.Fatal(err)
			}
			if status != "charged" || worker != "B" || charges != 1 || token != o.b.token {
				t.Errorf("order %d: payment is %s by %s, %d charges, fence token %d; want charged once by B with token %d",
					o.order, status, worker, charges, token, o.b.token)
			}
		}
	})
}

// TestGCPauseKilledHolder is the crash: A is killed (SIGKILL) while it holds the lease and
// never releases it. B, started at once, waits in leases.Acquire and is granted the lease,
// with a higher token, no earlier than A's grant expired by the database clock and within a
// bound; it charges exactly once.
func TestGCPauseKilledHolder(t *testing.T) {
	t.Parallel()
	r := newGCPauseRig(t)
	ctx := t.Context()
	n := 6
	if testing.Short() {
		n = 2
	}
	type outcome struct {
		order int64
		a, b  grant
	}
	outcomes := forOrders(t, 4000, n, func(order int64) (outcome, error) {
		o := outcome{order: order}
		a, err := r.start(t, "A", "fenced", "try", order)
		if err != nil {
			return o, err
		}
		if o.a, err = acquired(a); err != nil {
			return o, err
		}
		if err := a.Signal(syscall.SIGKILL); err != nil {
			return o, err
		}
		var exit *exec.ExitError
		if err := a.Wait(gcpauseStep); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			return o, fmt.Errorf("worker %s: exit %v, want killed by SIGKILL", a.Name(), err)
		}
		// B waits (bounded by WAIT inside the worker) for a lease nobody will release.
		b, err := r.start(t, "B", "fenced", "wait", order)
		if err != nil {
			return o, err
		}
		if o.b, err = acquired(b); err != nil {
			return o, err
		}
		if err := b.Send("go"); err != nil {
			return o, err
		}
		if _, err := b.Expect(gcpauseStep, "charged"); err != nil {
			return o, err
		}
		return o, b.Wait(gcpauseStep)
	})
	for _, o := range outcomes {
		if o.b.token <= o.a.token {
			t.Errorf("order %d: B's token %d is not higher than the killed holder's %d", o.order, o.b.token, o.a.token)
		}
		if o.b.acquiredAt.Before(o.a.expiresAt) {
			t.Errorf("order %d: B was granted at %v, before the killed holder's grant expired at %v", o.order, o.b.acquiredAt, o.a.expiresAt)
		}
		got := chargesOf(ctx, t, r.pool, o.order)
		if len(got) != 1 || got[0] != (charge{"B", o.b.token}) {
			t.Errorf("order %d: charges %v, want exactly one, by B with token %d", o.order, got, o.b.token)
		}
	}
}
