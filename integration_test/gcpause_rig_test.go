//go:build unix

package integration_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

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
	pool, schema := workerDB(t, gcpauseSchema)
	ctx := t.Context()
	r := &gcpauseRig{pool: pool, url: pgtest.URL(t), schema: schema}
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
