package cli_test

import (
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Through PgBouncer 1.18 in transaction mode: a database alias whose connect_query sets
// search_path reaches the schema, with the default statement timeout (which the CLI applies
// per statement, not as a startup parameter the pooler would refuse); --schema against a
// plain database fails with an error naming the pooler instead of reading another schema;
// and migrate refuses the pooler.
func TestCLIBehindPgBouncer(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	d := newTestDB(t)
	if _, err := leases.TryAcquire(t.Context(), d.pool, "via-pooler", leases.MaxTTL/2, nil); err != nil {
		t.Fatal(err)
	}
	schema := d.pool.Config().ConnConfig.Database
	alias, plain := pgtest.PoolerURL(t, schema), pgtest.PoolerURL(t, "")

	for _, args := range [][]string{{"leases", "list"}, {"leases", "show", "via-pooler"}, {"semaphores", "list"}, {"outbox", "stats"}} {
		code, out, errOut := run(t, append([]string{"--database-url", alias, "--schema", schema}, args...)...)
		if code != cli.ExitOK || (args[0] == "leases" && !strings.Contains(out, "via-pooler")) {
			t.Errorf("%v through the schema's alias with the default statement timeout = %d, %q, %q; want it to work", args, code, out, errOut)
		}
	}
	code, out, errOut := run(t, "--database-url", plain, "--schema", schema, "leases", "list")
	if code != cli.ExitFailure || !strings.Contains(errOut, "search_path") || !strings.Contains(errOut, "pooler") || strings.Contains(out, "via-pooler") {
		t.Errorf("--schema through a plain pooler database = %d, %q, %q; want a failure naming search_path and the pooler", code, out, errOut)
	}
	code, _, errOut = run(t, "--database-url", alias, "--schema", schema, "migrate", "up")
	if code != cli.ExitFailure || !strings.Contains(errOut, "pooler") {
		t.Errorf("migrate up through the pooler = %d, %q; want a failure naming the pooler", code, errOut)
	}
}

// --statement-timeout bounds every statement, directly and (in the pooler leg) through
// PgBouncer: a command whose statement waits on a lock longer than the timeout is stopped
// and says which timeout it hit; the same command works with the default timeout.
func TestStatementTimeoutWithAndWithoutPooler(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	if _, err := leases.TryAcquire(t.Context(), d.pool, "timed", leases.MaxTTL/2, nil); err != nil {
		t.Fatal(err)
	}
	schema := d.flags[3]
	urls := map[string]string{"direct": pgtest.URL(t)}
	if pgtest.BehindPooler() {
		urls["pooler"] = pgtest.PoolerURL(t, schema)
	}
	for via, url := range urls {
		db := testDB{pool: d.pool, flags: []string{"--database-url-file", urlFile(t, url), "--schema", schema}}
		if code, out, errOut := db.run(t, "leases", "list"); code != cli.ExitOK || !strings.Contains(out, "timed") {
			t.Errorf("%s: leases list with the default statement timeout = %d, %q, %q", via, code, out, errOut)
		}
		// A direct session locks the lease table, so the CLI's read waits on the lock.
		tx, err := pgtest.Direct(t, d.pool).Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(t.Context(), "LOCK TABLE pgcoord_leases IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		r := await(t, db.start(t.Context(), "--statement-timeout", "300ms", "leases", "list"), progressLimit)
		_ = tx.Rollback(t.Context())
		// Outside a transaction the read may as well have been a commit: its outcome is unknown.
		if r.code != cli.ExitFailure || !strings.Contains(r.errOut, "--statement-timeout 300ms") ||
			!strings.Contains(r.errOut, "whether it committed is unknown") {
			t.Errorf("%s: a statement blocked past --statement-timeout 300ms = %d, %q; want it stopped, naming the timeout and an unknown outcome", via, r.code, r.errOut)
		}
	}
}
