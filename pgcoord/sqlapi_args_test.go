package pgcoord_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// This file checks, from plain SQL, that every SQL API function refuses bad arguments with
// a clear error, and writes nothing when it does: a NULL where a value is required raises
// SQLSTATE 22004, an empty or oversize name, a non-positive or too long interval, an
// out-of-range number, a non-positive token, a JSON value of the wrong type or arrays of
// different lengths raise 22023 (or the code the function documents), and the message
// ("pgcoord: lease ttl must be positive and at most 24 hours, got -00:00:01") names the
// argument. Each function is called with valid arguments but one, so a refusal is the
// function judging that argument, not a side effect of another.
//
// The table is checked against pg_proc: a function that takes arguments and is neither in
// sqlFuncs nor sqlAnswers nor sqlExempt fails the test, and so does a parameter that is
// added, renamed or removed without the table following, so no function skips this test.

// param is one parameter of a SQL API function, in declaration order.
type param struct {
	name   string     // as declared (p_ttl)
	valid  string     // SQL expression of a valid value, used while another parameter is tested
	what   string     // how the function's error messages name the parameter
	nullOK bool       // NULL is a valid, documented value; otherwise a NULL must raise 22004
	bad    []badValue // values the function must refuse
	ok     []string   // SQL expressions of other values it must accept: the edges of the range
}

// badValue is a value a function must refuse.
type badValue struct {
	expr string // SQL expression
	code string // the SQLSTATE it must raise: 22023 when empty
	says string // what the message must contain: the parameter's what when empty
}

// sqlFunc is a SQL API function and how to call it.
type sqlFunc struct {
	name string
	// family groups functions that touch the same tables: a family's calls run one after
	// another (their transactions would only wait for each other's row locks), families
	// run in parallel.
	family string
	params []param
}

func bad(exprs ...string) []badValue {
	vs := make([]badValue, len(exprs))
	for i, e := range exprs {
		vs[i] = badValue{expr: e}
	}
	return vs
}

// nameParam is a name, holder, key, topic, scope or claimant: 1 to 255 bytes (not
// characters: 'é' is two bytes).
func nameParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`''`, `repeat('x', 256)`, `repeat('é', 128)`),
		ok:  []string{`repeat('x', 255)`, `'é'`}}
}

// ttlParam is an interval in (0, 24 hours]. An interval with months has no fixed length
// ('1 mon -29 days' compares as 24 hours but lasts up to two days from the 1st of a long
// month, and '100 years -35999 days' lasts over a year): it is refused too.
func ttlParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`interval '0'`, `interval '-1 second'`, `interval '24 hours 1 microsecond'`,
			`interval '2 days'`, `interval '1 mon -29 days'`, `interval '100 years -35999 days'`),
		ok: []string{`interval '1 microsecond'`, `interval '24 hours'`, `interval '1 day'`}}
}

// tokenParam is a fence or claim token: positive.
func tokenParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`0`, `-1`, `-9223372036854775808`),
		ok:  []string{`9223372036854775807`}}
}

// limitParam is an integer in [lo, hi].
func limitParam(name, what, valid string, lo, hi int64) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(fmt.Sprint(lo-1), fmt.Sprint(hi+1), `-2147483648`),
		ok:  []string{fmt.Sprint(lo), fmt.Sprint(hi)}}
}

func durableParam() param {
	return param{name: "p_durable", valid: `true`, what: "p_durable", ok: []string{`false`}}
}

func syncCommitParam() param {
	return param{name: "p_sync_commit", valid: `NULL`, nullOK: true, what: "synchronous_commit",
		bad: bad(`'off'`, `'local'`, `''`),
		ok:  []string{`'on'`, `'remote_write'`, `'remote_apply'`}}
}

// The fixture's rows (argsFixture), as the valid arguments name them.
const (
	leaseToken  = `(SELECT fence_token FROM pgcoord_leases WHERE name = 'order:42')`
	jobSlot     = `(SELECT scheduled_for FROM pgcoord_job_runs WHERE job = 'nightly')`
	jobToken    = `(SELECT fence_token FROM pgcoord_job_runs WHERE job = 'nightly')`
	permitToken = `(SELECT fence_token FROM pgcoord_semaphore_permits WHERE key = 'tenant:a' AND holder = 'w1')`
	claimToken  = `(SELECT claim_token FROM pgcoord_outbox WHERE key = 'o-1')`
	claimedIDs  = `ARRAY(SELECT id FROM pgcoord_outbox WHERE key = 'o-1')`
)

// sqlFuncs lists every SQL API function that checks its arguments, with its parameters;
// each family's entries are in sqlapi_args_<family>_test.go.
var sqlFuncs = slices.Concat(
	sqlLeaseFuncs,
	sqlJobFuncs,
	sqlSemaphoreFuncs,
	sqlIdempotencyFuncs,
	sqlOutboxFuncs,
	sqlGCFuncs,
	sqlRatelimitFuncs,
	sqlScheduleFuncs,
	sqlCronFuncs,
	sqlPartitionFuncs,
)

// argsFixture commits the rows the valid arguments name: a held lease and its register,
// a running job, a semaphore key with one permit of two and demand, a full one, an
// idempotency key in flight
// (its attempt's lease runs an hour), and two outbox keys, one of them claimed.
func argsFixture(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, q := range []string{
		`SELECT count(*) FROM pgcoord_lease_acquire('order:42', 'worker', '1 hour')`,
		`SELECT count(*) FROM pgcoord_fence_check('order:42', ` + leaseToken + `)`,
		`SELECT count(*) FROM pgcoord_job_claim('nightly', '1 hour', NULL, 'forbid', 'runner', '1 hour')`,
		`SELECT count(*) FROM pgcoord_semaphore_set_limit('tenant:a', 2)`,
		`SELECT count(*) FROM pgcoord_semaphore_add_demand('tenant:a', 3)`,
		`SELECT count(*) FROM pgcoord_semaphore_acquire('tenant:a', 'w1', 2, '1 hour')`,
		`SELECT count(*) FROM pgcoord_semaphore_acquire('tenant:full', 'w1', 1, '1 hour')`,
		`SELECT count(*) FROM pgcoord_idempotency_claim('api', 'req-1', '\x01', 'attempt-1', '1 day', '1 hour')`,
		`SELECT count(*) FROM pgcoord_outbox_enqueue('orders', 'o-1', '{"n": 1}')`,
		`SELECT count(*) FROM pgcoord_outbox_claim('relay-0', 1, 1, 1048576, '1 hour')`, // o-1
		`SELECT count(*) FROM pgcoord_outbox_enqueue('orders', 'o-2', '{"n": 2}')`,
		`SELECT count(*) FROM pgcoord_ratelimit_set('api', 10, '1 second', 5)`,
		`SELECT count(*) FROM pgcoord_schedule_create('sched', '0 * * * *', 'UTC', 'h')`,
		`SELECT count(*) FROM pgcoord_schedule_trigger('sched')`,
		`SELECT count(*) FROM pgcoord_partition_create('grid', 8)`,
		`SELECT count(*) FROM pgcoord_partition_heartbeat('grid', 'w1', 1, '1 hour')`,
	} {
		var n int
		if err := pool.QueryRow(t.Context(), q).Scan(&n); err != nil || n != 1 {
			t.Fatalf("fixture: %s: %d rows, %v", q, n, err)
		}
	}
}

// call is the SQL of a call of f with its valid arguments, but with the values in
// replace, in named notation.
func (f sqlFunc) call(replace map[string]string) string {
	args := make([]string, len(f.params))
	for i, p := range f.params {
		v, ok := replace[p.name]
		if !ok {
			v = p.valid
		}
		args[i] = p.name + " => " + v
	}
	return fmt.Sprintf("SELECT count(*), coalesce(string_agg(r::text, ' '), '') FROM %s(%s) AS r",
		f.name, strings.Join(args, ", "))
}

func TestSQLArgs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	argsFixture(t, pool)

	t.Run("every function is covered", func(t *testing.T) { checkCoverage(t, pool) })
	base := digest(t, pool)

	t.Run("no caller clock", func(t *testing.T) { checkNoCallerClock(t, pool, base) })
	t.Run("issue 14 cases", func(t *testing.T) { checkIssueCases(t, pool, base) })

	t.Run("read-only functions answer", func(t *testing.T) {
		for _, name := range slices.Sorted(maps.Keys(sqlAnswers)) {
			for _, expr := range sqlAnswers[name] {
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT "+expr).Scan(&ok); err != nil || !ok {
					t.Errorf("SELECT %s = %v, %v; want true", expr, ok, err)
				}
			}
		}
	})

	families := map[string][]sqlFunc{}
	for _, f := range sqlFuncs {
		families[f.family] = append(families[f.family], f)
	}
	for _, family := range slices.Sorted(maps.Keys(families)) {
		t.Run(family, func(t *testing.T) {
			t.Parallel()
			conn, err := pool.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			for _, f := range families[family] {
				t.Run(f.name, func(t *testing.T) { checkFunc(t, conn.Conn(), f, base) })
			}
		})
	}
}

// checkFunc calls f with valid arguments, then with each bad value of each parameter in
// turn, the others valid.
func checkFunc(t *testing.T, conn *pgx.Conn, f sqlFunc, base map[string]string) {
	accepts(t, conn, f.call(nil), base)
	for _, p := range f.params {
		if !p.nullOK {
			refuses(t, conn, f.call(map[string]string{p.name: "NULL"}), "22004", p.what, base)
		} else if p.valid != "NULL" {
			accepts(t, conn, f.call(map[string]string{p.name: "NULL"}), base)
		}
		for _, b := range p.bad {
			code, says := b.code, b.says
			if code == "" {
				code = "22023"
			}
			if says == "" {
				says = p.what
			}
			refuses(t, conn, f.call(map[string]string{p.name: b.expr}), code, says, base)
		}
		for _, v := range p.ok {
			accepts(t, conn, f.call(map[string]string{p.name: v}), base)
		}
	}
}

// attempt runs query in a transaction of its own, in a savepoint, and returns its error,
// what it returned, and whether the committed tables differ from base after it: after the
// query if it succeeded, after rolling back to the savepoint if it failed. The
// transaction is always rolled back.
func attempt(t *testing.T, conn *pgx.Conn, query string, base map[string]string) (out string, wrote []string, err error) {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A call that should have been refused and instead waits for a lock must not hang the test.
	if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '60s'; SAVEPOINT call"); err != nil {
		t.Fatal(err)
	}
	var n int64
	err = tx.QueryRow(ctx, query).Scan(&n, &out)
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		t.Fatalf("%s: %v", query, err)
	}
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT call"); rerr != nil {
			t.Fatal(rerr)
		}
	}
	out = fmt.Sprintf("%d row(s) %.300s", n, out)
	now := digest(t, tx)
	for _, table := range slices.Sorted(maps.Keys(now)) {
		if now[table] != base[table] {
			wrote = append(wrote, table)
		}
	}
	return out, wrote, err
}

// refuses checks that query fails with SQLSTATE code, with a message that names what is
// wrong (contains says), and leaves every table as it was.
func refuses(t *testing.T, conn *pgx.Conn, query, code, says string, base map[string]string) {
	t.Helper()
	out, wrote, err := attempt(t, conn, query, base)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		t.Errorf("%s\n\treturned %s, writing %v; want SQLSTATE %s naming %q", query, out, wrote, code, says)
		return
	case !errors.As(err, &pgErr) || pgErr.Code != code:
		t.Errorf("%s\n\tfailed with %v; want SQLSTATE %s naming %q", query, err, code, says)
	case !strings.Contains(pgErr.Message, says) ||
		(code == "22004" || code == "22023") && !strings.HasPrefix(pgErr.Message, "pgcoord: "):
		t.Errorf("%s\n\tfailed with %q; want a message \"pgcoord: ...\" naming %q", query, pgErr.Message, says)
	}
	if len(wrote) > 0 {
		t.Errorf("%s\n\twas refused but changed %v", query, wrote)
	}
}

// accepts checks that query, with valid arguments, raises no error, but for SQLSTATE 55000:
// an idempotency key that the holder named does not hold (valid names of keys that do
// not exist).
func accepts(t *testing.T, conn *pgx.Conn, query string, base map[string]string) {
	t.Helper()
	_, _, err := attempt(t, conn, query, base)
	if pgErr := (*pgconn.PgError)(nil); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "55000") {
		t.Errorf("%s\n\tfailed with %v; valid arguments must be accepted", query, err)
	}
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// digest returns, for each pgcoord table of the current schema, its row count and a hash
// of its rows.
func digest(t *testing.T, q querier) map[string]string {
	t.Helper()
	ctx := t.Context()
	var query string
	err := q.QueryRow(ctx, `
		SELECT string_agg(format('SELECT %L, count(*) || '' '' || md5(coalesce(string_agg(x::text, '','' ORDER BY x::text), '''')) FROM %I x',
		                         tablename, tablename), ' UNION ALL ')
		  FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'pgcoord\_%'`).Scan(&query)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := q.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var table, sum string
		if err := rows.Scan(&table, &sum); err != nil {
			t.Fatal(err)
		}
		out[table] = sum
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
