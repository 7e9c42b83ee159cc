package cli_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

type statusJSON struct {
	Schema         string `json:"schema"`
	CurrentVersion int64  `json:"current_version"`
	LatestVersion  int64  `json:"latest_version"`
	Pending        int    `json:"pending"`
	Migrations     []struct {
		Version   int64  `json:"version"`
		Name      string `json:"name"`
		Applied   bool   `json:"applied"`
		AppliedAt string `json:"applied_at"`
	} `json:"migrations"`
}

func status(t *testing.T, db, schema string) (int, statusJSON) {
	t.Helper()
	code, out, errOut := run(t, "--database-url", db, "--schema", schema, "--json", "migrate", "status", "--check")
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("migrate status --json printed %q (stderr %q): %v", out, errOut, err)
	}
	return code, st
}

// The round trip from the issue: up, down --all, up, on a schema that does not exist yet
// (not public), with status --check answering 3 while migrations are pending and 0 after.
func TestMigrateUpDownUpRoundTrip(t *testing.T) {
	t.Parallel()
	db := pgtest.URL(t)
	schema := pgtest.SchemaName(t)

	code, out, errOut := run(t, "--database-url", db, "--schema", schema, "migrate", "up")
	if code != cli.ExitOK || !strings.Contains(out, "applied 00001_foundation") {
		t.Fatalf("migrate up = %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, st := status(t, db, schema)
	if code != cli.ExitOK || st.Schema != schema || st.Pending != 0 || st.CurrentVersion != pgcoord.LatestVersion() {
		t.Fatalf("status after up: exit %d, %+v", code, st)
	}
	if len(st.Migrations) == 0 || !st.Migrations[0].Applied || st.Migrations[0].AppliedAt == "" {
		t.Fatalf("status after up lists %+v", st.Migrations)
	}

	code, out, _ = run(t, "--database-url", db, "--schema", schema, "migrate", "down", "--all", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "would roll back 00001_foundation") {
		t.Fatalf("down --all --dry-run = %d, %q", code, out)
	}
	if code, st = status(t, db, schema); code != cli.ExitOK {
		t.Fatalf("--dry-run changed the schema: %+v", st)
	}

	code, out, errOut = run(t, "--database-url", db, "--schema", schema, "--json", "migrate", "down", "--all", "--yes")
	var down struct {
		RolledBack []struct {
			Version int64 `json:"version"`
		} `json:"rolled_back"`
	}
	if err := json.Unmarshal([]byte(out), &down); code != cli.ExitOK || err != nil || len(down.RolledBack) != len(pgcoord.Migrations()) {
		t.Fatalf("down --all --json = %d, %q (%v), stderr %q", code, out, err, errOut)
	}
	code, st = status(t, db, schema)
	if code != cli.ExitCheck || st.Pending != len(pgcoord.Migrations()) || st.CurrentVersion != 0 {
		t.Fatalf("status --check with pending migrations: exit %d, %+v; want exit 3", code, st)
	}
	if code, _, _ = run(t, "--database-url", db, "--schema", schema, "migrate", "up"); code != cli.ExitOK {
		t.Fatalf("second migrate up exit %d", code)
	}
	if code, _ = status(t, db, schema); code != cli.ExitOK {
		t.Fatalf("status --check after the second up: exit %d", code)
	}
	code, out, _ = run(t, "--database-url", db, "--schema", schema, "migrate", "up")
	if code != cli.ExitOK || !strings.Contains(out, "nothing applied") {
		t.Fatalf("migrate up on a current schema = %d, %q", code, out)
	}
}

// `migrate sql` needs no database, and its script brings a schema to the same state as
// `migrate up`.
func TestMigrateSQLScriptIsApplicable(t *testing.T) {
	t.Parallel()
	code, script, errOut := run(t, "--database-url", "postgres://nobody@127.0.0.1:1/none", "migrate", "sql")
	if code != cli.ExitOK || !strings.Contains(script, "CREATE FUNCTION pgcoord_lock_key") {
		t.Fatalf("migrate sql = %d, stderr %q, script:\n%s", code, errOut, script)
	}
	pool, schema := pgtest.Schema(t)
	if _, err := pool.Exec(context.Background(), script); err != nil {
		t.Fatalf("applying migrate sql's script: %v", err)
	}
	if code, st := status(t, pgtest.URL(t), schema); code != cli.ExitOK {
		t.Fatalf("status --check after applying the script: exit %d, %+v", code, st)
	}
	code, upgrade, _ := run(t, "migrate", "sql", "--from", "1")
	if code != cli.ExitOK || strings.Contains(upgrade, "00001_foundation") {
		t.Fatalf("migrate sql --from 1 = %d and still contains migration 1:\n%s", code, upgrade)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	cases := [][]string{
		{"no-such-command"},
		{"migrate", "bogus"},
		{"leases", "bogus"},
		{"fence", "bogus"},
		{"migrate", "up", "--no-such-flag"},
		{"migrate", "up", "--to", "999"},
		{"migrate", "up", "extra-arg"},
		{"migrate", "down", "--all", "--to", "1"},
		{"migrate", "down", "--to", "-1"},
		{"migrate", "sql", "--from", "-2"},
		{"migrate", "status", "--check=maybe"},
		{"--database-url", "postgres://u:pw@host:notaport/db", "migrate", "status"},
	}
	for _, args := range cases {
		code, out, errOut := run(t, args...)
		if code != cli.ExitUsage {
			t.Errorf("pgcoord %s: exit %d, want %d (stdout %q, stderr %q)", strings.Join(args, " "), code, cli.ExitUsage, out, errOut)
		}
		if !strings.HasPrefix(errOut, "pgcoord: ") {
			t.Errorf("pgcoord %s: stderr %q does not start with an error", strings.Join(args, " "), errOut)
		}
	}
}

// Connection failures exit 1 and never print the password, whatever form it came in.
func TestConnectionErrorsHidePassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	for _, dsn := range []string{
		"postgres://alice:" + secret + "@127.0.0.1:1/db?connect_timeout=2",
		"host=127.0.0.1 port=1 user=alice password=" + secret + " dbname=db connect_timeout=2",
		"postgres://alice:" + secret + "@127.0.0.1:notaport/db",
	} {
		code, out, errOut := run(t, "--database-url", dsn, "migrate", "status")
		if code == cli.ExitOK {
			t.Errorf("migrate status against %q succeeded", dsn)
		}
		if strings.Contains(out+errOut, secret) {
			t.Errorf("the password was printed: stdout %q, stderr %q", out, errOut)
		}
		if errOut == "" {
			t.Errorf("no error printed for %q", dsn)
		}
	}
}

// --database-url wins over $PGCOORD_DATABASE_URL, which wins over the libpq PG* variables.
// Not parallel: it sets environment variables.
func TestConnectionPrecedence(t *testing.T) {
	db := pgtest.URL(t)
	_, schema := pgtest.Schema(t)
	bad := "postgres://nobody:x@127.0.0.1:1/none?connect_timeout=2"

	t.Setenv(cli.EnvDatabaseURL, bad)
	if code, _, errOut := run(t, "--database-url", db, "--schema", schema, "migrate", "status"); code != cli.ExitOK {
		t.Fatalf("--database-url did not win over $%s: exit %d, %s", cli.EnvDatabaseURL, code, errOut)
	}
	t.Setenv(cli.EnvDatabaseURL, db)
	if code, _, errOut := run(t, "--schema", schema, "migrate", "status"); code != cli.ExitOK {
		t.Fatalf("$%s was not used: exit %d, %s", cli.EnvDatabaseURL, code, errOut)
	}

	// Neither flag nor variable: the libpq variables, taken here from the test URL.
	os.Unsetenv(cli.EnvDatabaseURL)
	cfg, err := pgx.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(db)
	for k, v := range map[string]string{
		"PGHOST": cfg.Host, "PGPORT": u.Port(), "PGUSER": cfg.User, "PGPASSWORD": cfg.Password,
		"PGDATABASE": cfg.Database, "PGSSLMODE": "disable",
	} {
		t.Setenv(k, v)
	}
	if code, _, errOut := run(t, "--schema", schema, "migrate", "status"); code != cli.ExitOK {
		t.Fatalf("libpq PG* variables were not used: exit %d, %s", code, errOut)
	}
}

func TestVersionJSON(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "--json", "version")
	var v struct {
		Version       string `json:"version"`
		SchemaVersion int64  `json:"schema_version"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != cli.ExitOK || err != nil || v.Version == "" || v.SchemaVersion != pgcoord.LatestVersion() {
		t.Fatalf("version --json = %d, %q (%v)", code, out, err)
	}
}
