package cli_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// runProcess runs the real command in a process of its own with stdin as its standard
// input (not a terminal) and returns its exit code and standard error.
func (d testDB) runProcess(t *testing.T, stdin string, args ...string) (int, string) {
	t.Helper()
	return runReal(t, nil, strings.NewReader(stdin), append(slices.Clone(d.flags), args...)...)
}

// runReal runs the real command with args in a process of its own, with env (nil: this
// process's) and stdin, and returns its exit code and standard error.
func runReal(t *testing.T, env []string, stdin io.Reader, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{asCLI}, args...)...)
	cmd.Env, cmd.Stdin = env, stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("pgcoord %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

func schemaVersion(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	st, err := pgcoord.CheckSchema(context.Background(), pool)
	if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
		t.Fatal(err)
	}
	return st.Current
}

// migrate down lists what it drops and rolls back only when confirmed: without a terminal
// it needs --yes, and it refuses to roll back the leases migration while a lease is held
// unless --force.
func TestMigrateDownNeedsConfirmation(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	latest := pgcoord.LatestVersion()

	code, errOut := d.runProcess(t, "y\n", "migrate", "down", "--all")
	if code != cli.ExitUsage || !strings.Contains(errOut, "not a terminal") || !strings.Contains(errOut, "--yes") ||
		!strings.Contains(errOut, "00002_leases: drops table pgcoord_fence_floor, table pgcoord_fences, table pgcoord_leases") ||
		!strings.Contains(errOut, "fence tokens start again at 1") {
		t.Errorf("down --all without a terminal or --yes = %d, %q; want exit 2 listing what it drops and asking for --yes", code, errOut)
	}
	if v := schemaVersion(t, d.pool); v != latest {
		t.Fatalf("a refused rollback changed the schema to version %d", v)
	}

	if _, err := leases.TryAcquire(t.Context(), d.pool, "still-held", leases.MaxTTL/2, nil); err != nil {
		t.Fatal(err)
	}
	code, errOut = d.runProcess(t, "", "migrate", "down", "--all", "--yes")
	if code != cli.ExitFailure || !strings.Contains(errOut, "1 lease(s) are held") || !strings.Contains(errOut, "--force") {
		t.Errorf("down --all --yes with a lease held = %d, %q; want exit 1 naming the held lease and --force", code, errOut)
	}
	if v := schemaVersion(t, d.pool); v != latest {
		t.Fatalf("a rollback refused for a held lease changed the schema to version %d", v)
	}

	// Rolling back the newest migration alone keeps the leases: a held lease does not stop it.
	code, errOut = d.runProcess(t, "", "migrate", "down", "--yes")
	if v := schemaVersion(t, d.pool); code != cli.ExitOK || v != latest-1 {
		t.Errorf("down --yes (newest only) with a lease held = %d, %q, version %d; want version %d", code, errOut, v, latest-1)
	}
	// The audit log survives that rollback, in the form it had before the newest migration,
	// and records it.
	var recorded int
	if err := d.pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_audit WHERE action = 'migrate.down'`).Scan(&recorded); err != nil || recorded != 1 {
		t.Errorf("migrate.down audit rows after rolling back the newest migration: %d, %v; want 1", recorded, err)
	}

	code, errOut = d.runProcess(t, "", "migrate", "down", "--all", "--yes", "--force")
	if v := schemaVersion(t, d.pool); code != cli.ExitOK || v != 0 {
		t.Errorf("down --all --yes --force = %d, %q, version %d; want everything rolled back", code, errOut, v)
	}
	var leasesTable *string
	if err := d.pool.QueryRow(t.Context(), "SELECT to_regclass('pgcoord_leases')::text").Scan(&leasesTable); err != nil || leasesTable != nil {
		t.Errorf("pgcoord_leases after down --all --force: %v, %v", leasesTable, err)
	}
}
