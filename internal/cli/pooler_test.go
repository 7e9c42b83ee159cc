package cli_test

import (
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// Through PgBouncer 1.18 in transaction mode: a database alias whose connect_query sets
// search_path reaches the schema (with --statement-timeout 0: the pooler refuses a
// statement_timeout startup parameter, with an error naming it); --schema against a plain
// database fails with an error naming the pooler instead of reading another schema; and
// migrate refuses the pooler.
func TestCLIBehindPgBouncer(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	d := newLeaseDB(t)
	if _, err := leases.TryAcquire(t.Context(), d.pool, "via-pooler", leases.MaxTTL/2, nil); err != nil {
		t.Fatal(err)
	}
	schema := d.pool.Config().ConnConfig.Database
	alias, plain := pgtest.PoolerURL(t, schema), pgtest.PoolerURL(t, "")

	code, out, errOut := run(t, "--database-url", alias, "--schema", schema, "--statement-timeout", "0", "leases", "list")
	if code != cli.ExitOK || !strings.Contains(out, "via-pooler") {
		t.Errorf("leases list through the schema's alias = %d, %q, %q; want the lease listed", code, out, errOut)
	}
	code, _, errOut = run(t, "--database-url", alias, "--schema", schema, "leases", "list")
	if code != cli.ExitFailure || !strings.Contains(errOut, "statement_timeout") || !strings.Contains(errOut, "--statement-timeout 0") {
		t.Errorf("with the default statement timeout = %d, %q; want a failure naming statement_timeout and the way out", code, errOut)
	}
	code, out, errOut = run(t, "--database-url", plain, "--schema", schema, "--statement-timeout", "0", "leases", "list")
	if code != cli.ExitFailure || !strings.Contains(errOut, "search_path") || !strings.Contains(errOut, "pooler") || strings.Contains(out, "via-pooler") {
		t.Errorf("--schema through a plain pooler database = %d, %q, %q; want a failure naming search_path and the pooler", code, out, errOut)
	}
	code, _, errOut = run(t, "--database-url", alias, "--schema", schema, "--statement-timeout", "0", "migrate", "up")
	if code != cli.ExitFailure || !strings.Contains(errOut, "pooler") {
		t.Errorf("migrate up through the pooler = %d, %q; want a failure naming the pooler", code, errOut)
	}
}
