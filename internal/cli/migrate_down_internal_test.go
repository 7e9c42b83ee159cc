package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// On a terminal, migrate down asks (y/N) and rolls back only on yes; any other answer, an
// empty one included, changes nothing (exit 1). The terminal is the app's seam: its input is
// an injected reader that claims to be a terminal.
func TestMigrateDownAsksOnATerminal(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	pgtest.Migrate(t, pool, nil)
	version := func() int64 {
		st, err := pgcoord.CheckSchema(context.Background(), pool)
		if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
			t.Fatal(err)
		}
		return st.Current
	}
	latest := pgcoord.LatestVersion()
	for _, c := range []struct {
		answer string
		code   int
		want   int64
	}{
		{"n\n", ExitFailure, latest},
		{"\n", ExitFailure, latest},
		{"", ExitFailure, latest}, // end of input
		{"maybe\n", ExitFailure, latest},
		{"y\n", ExitOK, latest - 1},
		{"YES\n", ExitOK, latest - 2},
	} {
		var out, errOut bytes.Buffer
		a := &app{out: &out, errOut: &errOut, lookupEnv: func(string) (string, bool) { return "", false },
			in: strings.NewReader(c.answer), inIsTerminal: func() bool { return true }}
		code := a.run(context.Background(), []string{"--database-url", pgtest.URL(t), "--schema", schema, "migrate", "down"})
		if code != c.code || version() != c.want || !strings.Contains(errOut.String(), "Roll back 1 migration(s)? [y/N] ") {
			t.Errorf("answer %q: exit %d, version %d, stderr %q; want exit %d, version %d", c.answer, code, version(), errOut.String(), c.code, c.want)
		}
		if c.code == ExitFailure && !strings.Contains(errOut.String(), "not confirmed: nothing rolled back") {
			t.Errorf("answer %q: stderr %q does not say nothing was rolled back", c.answer, errOut.String())
		}
	}
}
