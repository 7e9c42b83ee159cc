// Package sqlclients runs the examples of pgcoord's SQL API from outside Go: a Python worker
// (worker.py, psycopg) and a pg_cron recipe (cron.sql). See README.md.
package sqlclients

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// missing skips t because something the example needs is not installed, or fails it when CI
// is set: CI installs it (.ci/run), so a missing one there is a broken machine.
func missing(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is missing in CI: %v", what, err)
	}
	t.Skipf("%s is missing (apt-get install -y python3-psycopg postgresql-15-cron): %v", what, err)
}

// python returns a Python 3 that can import psycopg: PGCOORD_TEST_PYTHON if set, else
// Debian's /usr/bin/python3 (where python3-psycopg installs it), else python3 on PATH. The
// first python3 on PATH may be another build (pyenv, a virtualenv) without psycopg.
func python(t *testing.T) string {
	t.Helper()
	candidates := []string{"/usr/bin/python3", "python3"}
	if p := os.Getenv("PGCOORD_TEST_PYTHON"); p != "" {
		candidates = []string{p}
	}
	var errs []error
	for _, p := range candidates {
		out, err := exec.Command(p, "-c", "import psycopg").CombinedOutput()
		if err == nil {
			return p
		}
		errs = append(errs, fmt.Errorf("%s: %v: %s", p, err, out))
	}
	missing(t, "a python3 with psycopg", fmt.Errorf("%v", errs))
	return ""
}
