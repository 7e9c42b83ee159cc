package cli_test

import (
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
)

// A typo at any level is a usage error that suggests the closest command (or flag) and
// points to the help of the command it was typed under; no database is needed.
func TestTyposGetSuggestionsAtEveryLevel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args       []string
		want, help string
	}{
		{[]string{"lease"}, `unknown command "lease" for "pgcoord"; did you mean leases?`, "pgcoord"},
		{[]string{"leases", "lst"}, `unknown command "lst" for "pgcoord leases"; did you mean list?`, "pgcoord leases"},
		{[]string{"outbox", "stat"}, `unknown command "stat" for "pgcoord outbox"; did you mean stats?`, "pgcoord outbox"},
		{[]string{"migrate", "dwn"}, `unknown command "dwn" for "pgcoord migrate"; did you mean down?`, "pgcoord migrate"},
		{[]string{"semaphores", "set-limt", "k", "1"}, `did you mean set-limit?`, "pgcoord semaphores"},
		{[]string{"leases", "bogus"}, `unknown command "bogus" for "pgcoord leases"`, "pgcoord leases"},
		{[]string{"leases", "list", "--jsn"}, "unknown flag: --jsn; did you mean --json?", "pgcoord leases list"},
		{[]string{"leases", "list", "--limt", "3"}, "unknown flag: --limt; did you mean --limit?", "pgcoord leases list"},
		{[]string{"leases", "list", "extra"}, "takes 0 argument(s), got 1", "pgcoord leases list"},
	} {
		code, out, errOut := run(t, c.args...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, c.want) ||
			!strings.Contains(errOut, "Run '"+c.help+" --help' for usage.") {
			t.Errorf("pgcoord %v = %d, %q, %q; want exit 2 with %q and a pointer to '%s --help'", c.args, code, out, errOut, c.want, c.help)
		}
	}
	if _, _, errOut := run(t, "leases", "bogus"); strings.Contains(errOut, "did you mean") {
		t.Errorf("a name far from every command got a suggestion: %q", errOut)
	}
}

// A group run alone prints its help with a usage line that asks for a subcommand; a leaf
// command's usage line is its own.
func TestGroupUsageLines(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:\n  pgcoord <command> [flags]\n"},
		{[]string{"leases"}, "Usage:\n  pgcoord leases <command> [flags]\n"},
		{[]string{"outbox"}, "Usage:\n  pgcoord outbox <command> [flags]\n"},
		{[]string{"semaphores", "--help"}, "Usage:\n  pgcoord semaphores <command> [flags]\n"},
		{[]string{"leases", "list", "--help"}, "Usage:\n  pgcoord leases list [flags]\n"},
		{[]string{"semaphores", "set-limit", "--help"}, "Usage:\n  pgcoord semaphores set-limit KEY LIMIT [flags]\n"},
	} {
		code, out, errOut := run(t, c.args...)
		if code != cli.ExitOK || !strings.Contains(out, c.want) || strings.Contains(out, "[command]") {
			t.Errorf("pgcoord %v = %d, %q, %q; want the usage line %q", c.args, code, out, errOut, c.want)
		}
	}
}

// A negative number where an argument is expected is refused for what it is, not as an
// unknown flag; after -- it reaches the command, which refuses the value. The metrics
// command's listen errors name it, not the dashboard.
func TestValueErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"semaphores", "set-limit", "tenant:1", "-1"}, "-1 is not a flag, and no argument of pgcoord semaphores set-limit may be negative (usage: pgcoord semaphores set-limit KEY LIMIT [flags])"},
		{[]string{"semaphores", "set-limit", "tenant:1", "--", "-1"}, `limit "-1": want an integer of at least 1`},
		{[]string{"outbox", "show", "-5"}, "-5 is not a flag, and no argument of pgcoord outbox show may be negative"},
		{[]string{"metrics", "--listen", "0.0.0.0:9190"}, "pgcoord: metrics: listening beyond loopback needs an auth token"},
		{[]string{"metrics", "--listen", "9190"}, `pgcoord: metrics: listen address "9190": want host:port`},
	} {
		code, out, errOut := run(t, c.args...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "unknown shorthand") || strings.Contains(errOut, "ui:") {
			t.Errorf("pgcoord %v = %d, %q, %q; want exit 2 with %q", c.args, code, out, errOut, c.want)
		}
	}
}
