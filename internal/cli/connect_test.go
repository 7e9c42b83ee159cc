package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// With nothing naming a database — no --database-url, no $PGCOORD_DATABASE_URL, no libpq
// variable: the real command in a process with an empty environment — a failed connection
// says where the CLI looked and which libpq defaults it tried, as a usage error.
func TestNoDatabaseGivenSaysWhereItLooked(t *testing.T) {
	t.Parallel()
	code, stderr := runReal(t, []string{}, nil, "leases", "list")
	if code != cli.ExitUsage {
		t.Fatalf("leases list in an empty environment: exit %d, stderr %q; want exit %d", code, stderr, cli.ExitUsage)
	}
	for _, want := range []string{"no database given", "--database-url", "$PGCOORD_DATABASE_URL", "PGHOST", "PGSERVICE",
		"libpq defaults were tried", "failed", "Run 'pgcoord leases list --help'"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
}

// A command run against a schema without pgcoord (or with an older pgcoord) says which
// schema it looked in and to run 'pgcoord migrate up', not just that a relation is missing.
func TestUnmigratedSchemaSaysWhatToRun(t *testing.T) {
	t.Parallel()
	_, empty := pgtest.Schema(t)
	for _, args := range [][]string{{"leases", "list"}, {"outbox", "stats"}, {"semaphores", "list"}} {
		code, _, errOut := run(t, append([]string{"--database-url", pgtest.URL(t), "--schema", empty}, args...)...)
		if code != cli.ExitFailure || !strings.Contains(errOut, `pgcoord is not installed in schema "`+empty+`" (from --schema)`) ||
			!strings.Contains(errOut, "run 'pgcoord --schema "+empty+" migrate up'") {
			t.Errorf("%v in an empty schema = %d, %q; want exit 1 naming the schema and 'migrate up'", args, code, errOut)
		}
	}
	missing := pgtest.SchemaName(t)
	code, _, errOut := run(t, "--database-url", pgtest.URL(t), "--schema", missing, "leases", "list")
	if code != cli.ExitFailure || !strings.Contains(errOut, "no schema found: --schema names none that exists") {
		t.Errorf("leases list in a schema that does not exist = %d, %q", code, errOut)
	}
	old, schema := pgtest.Schema(t)
	pgtest.Migrate(t, old, &pgcoord.MigrateOpts{To: 2}) // leases, no outbox
	code, _, errOut = run(t, "--database-url", pgtest.URL(t), "--schema", schema, "outbox", "stats")
	if code != cli.ExitFailure || !strings.Contains(errOut, `schema "`+schema+`" (from --schema) lacks a migration this command needs`) ||
		!strings.Contains(errOut, "migrate up") {
		t.Errorf("outbox stats in a schema migrated to version 2 = %d, %q", code, errOut)
	}
	if code, _, errOut := run(t, "--database-url", pgtest.URL(t), "--schema", schema, "leases", "list"); code != cli.ExitOK {
		t.Errorf("leases list in a schema migrated to version 2 = %d, %q", code, errOut)
	}
}

// version prints the binary's version and, when the database is reachable, the schema's
// applied version and whether it is current; without a database it still answers, exit 0.
func TestVersionShowsTheDatabase(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "version")
	if code != cli.ExitOK || !strings.HasPrefix(out, "pgcoord ") ||
		!strings.Contains(out, fmt.Sprintf("database: schema %s at version %d: current", d.flags[3], pgcoord.LatestVersion())) {
		t.Errorf("version on a migrated schema = %d, %q, %q", code, out, errOut)
	}
	old, schema := pgtest.Schema(t)
	pgtest.Migrate(t, old, &pgcoord.MigrateOpts{To: 2})
	code, out, _ = run(t, "--database-url", pgtest.URL(t), "--schema", schema, "--json", "version")
	var v struct {
		Version  string `json:"version"`
		Database struct {
			Reached        bool   `json:"reached"`
			Schema         string `json:"schema"`
			CurrentVersion int64  `json:"current_version"`
			Pending        int    `json:"pending"`
			UpToDate       bool   `json:"up_to_date"`
		} `json:"database"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != cli.ExitOK || v.Version == "" || !v.Database.Reached ||
		v.Database.Schema != schema || v.Database.CurrentVersion != 2 || v.Database.Pending != int(pgcoord.LatestVersion())-2 || v.Database.UpToDate {
		t.Errorf("version --json on a schema at version 2 = %d, %q (%v)", code, out, err)
	}
	// Nothing listens on port 1: the database is not reached, and version still answers.
	code, out, errOut = run(t, "--database-url", "postgres://u@127.0.0.1:1/db?connect_timeout=5", "version")
	if code != cli.ExitOK || !strings.HasPrefix(out, "pgcoord ") || !strings.Contains(out, "database: not reached (connect to") {
		t.Errorf("version without a reachable database = %d, %q, %q", code, out, errOut)
	}
}
