package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// asCLI as the first argument makes the test binary act as the pgcoord command (the rest of
// the arguments are its own), for tests that need a real process: an empty environment, say.
const asCLI = "-pgcoord-test-as-cli"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == asCLI {
		os.Exit(cli.Run(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

// run runs the pgcoord command in-process and returns its exit code and output streams.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// testDB is a migrated schema of its own for one test, and the CLI flags that reach it.
type testDB struct {
	pool  *pgxpool.Pool
	flags []string
}

func newTestDB(t *testing.T) testDB {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	pgtest.Migrate(t, pool, nil)
	return testDB{pool: pool, flags: []string{"--database-url-file", urlFile(t, pgtest.URL(t)), "--schema", schema}}
}

// urlFile writes url to a file only its owner may read, for --database-url-file (a
// password in --database-url draws a warning on stderr).
func urlFile(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "database-url")
	if err := os.WriteFile(path, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs pgcoord against the test's schema.
func (d testDB) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return run(t, append(slices.Clone(d.flags), args...)...)
}

type result struct {
	code        int
	out, errOut string
	elapsed     time.Duration
}

// start runs pgcoord against the test's schema in the background, with ctx.
func (d testDB) start(ctx context.Context, args ...string) <-chan result {
	ch := make(chan result, 1)
	all := append(slices.Clone(d.flags), args...)
	go func() {
		var out, errOut bytes.Buffer
		t0 := time.Now()
		code := cli.Run(ctx, all, &out, &errOut)
		ch <- result{code, out.String(), errOut.String(), time.Since(t0)}
	}()
	return ch
}

// await returns the result of a background run, failing the test if it takes longer than d.
func await(t *testing.T, ch <-chan result, d time.Duration) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("pgcoord did not exit within %v", d)
		return result{}
	}
}

// progressLimit bounds a wait for observed progress (a child started, a run ended): the
// waits end as soon as it is seen, and a CI run under -race beside CPU hogs has taken more
// than 10 s to start a child process.
const progressLimit = 2 * pgtest.WaitLimit

// waitFor polls cond until it is true, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

func parseTime(t *testing.T, s *string) time.Time {
	t.Helper()
	if s == nil {
		t.Fatal("time is null")
	}
	tm, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil || !strings.HasSuffix(*s, "Z") {
		t.Fatalf("time %q is not RFC 3339 UTC: %v", *s, err)
	}
	return tm
}
