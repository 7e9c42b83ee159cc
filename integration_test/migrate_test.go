package integration_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// runCLI runs the pgcoord binary with PGCOORD_DATABASE_URL=db and returns its exit code.
func runCLI(t *testing.T, db string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(pgcoordBinary(t), args...)
	cmd.Env = append(os.Environ(), cli.EnvDatabaseURL+"="+db)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running pgcoord %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// On a server of its own (a fresh container, whatever PGCOORD_TEST_DATABASE_URL says), the
// real binary migrates an empty database up, all the way down and up again, in the default
// schema and in another one, and `migrate status --check` answers with its exit code.
func TestMigrateRoundTripOnFreshServer(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	for _, schema := range []string{"", "coord"} {
		var flags []string
		if schema != "" {
			flags = []string{"--schema", schema}
		}
		step := func(want int, args ...string) string {
			t.Helper()
			code, out, errOut := runCLI(t, srv.URL, append(flags, args...)...)
			if code != want {
				t.Fatalf("schema %q: pgcoord %s: exit %d, want %d\nstdout: %s\nstderr: %s",
					schema, strings.Join(args, " "), code, want, out, errOut)
			}
			return out
		}
		if schema != "" {
			// The schema does not exist yet: status has nothing to look at; up creates it.
			step(cli.ExitFailure, "migrate", "status")
		} else {
			step(cli.ExitCheck, "migrate", "status", "--check")
		}
		step(cli.ExitOK, "migrate", "up")
		step(cli.ExitOK, "migrate", "status", "--check")
		step(cli.ExitOK, "migrate", "down", "--all", "--yes")
		step(cli.ExitCheck, "migrate", "status", "--check")
		step(cli.ExitOK, "migrate", "up")
		out := step(cli.ExitOK, "migrate", "status", "--check")
		wantSchema := schema
		if wantSchema == "" {
			wantSchema = "public"
		}
		if !strings.Contains(out, "schema "+wantSchema+":") {
			t.Fatalf("status reports the wrong schema (want %s):\n%s", wantSchema, out)
		}
		// Retention runs on the fresh schema, and finds nothing to collect.
		if out := step(cli.ExitOK, "gc"); !strings.Contains(out, "deleted 0 rows older than 30d") {
			t.Fatalf("gc on a fresh schema printed:\n%s", out)
		}
	}
	step2 := func(args ...string) int { code, _, _ := runCLI(t, srv.URL, args...); return code }
	if code := step2("no-such-command"); code != cli.ExitUsage {
		t.Fatalf("a usage error exited %d, want %d", code, cli.ExitUsage)
	}
}
