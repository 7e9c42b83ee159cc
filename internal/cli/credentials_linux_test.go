package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// loginRole creates a role of its own that may use the test's schema, with a password
// found nowhere else, and returns a URL that logs in as it.
func loginRole(t *testing.T, d testDB) (role, password string, u *url.URL) {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	role, password = "pgcoord_cli_"+hex.EncodeToString(b[:4]), "Sekr3t-"+hex.EncodeToString(b)
	schema := pgconfig.QuoteIdent(d.flags[3])
	ctx := context.Background()
	for _, q := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, password),
		fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s`, schema, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s`, schema, role),
		fmt.Sprintf(`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA %s TO %s`, schema, role),
		fmt.Sprintf(`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO %s`, schema, role),
	} {
		if _, err := d.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s`, role))
		_, _ = d.pool.Exec(context.Background(), fmt.Sprintf(`DROP ROLE %s`, role))
	})
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return role, password, u
}

// runProcess runs pgcoord as a process of its own with env as its whole environment.
func runProcess(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{asCLI}, args...)...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("pgcoord %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// peek is what a command run by `leases run` prints of what it can see: its own
// environment, then its parent's (pgcoord's) environment and command line from /proc.
const peek = `env; echo '--- environ'; tr '\0' '\n' < /proc/$PPID/environ; echo '--- cmdline'; tr '\0' ' ' < /proc/$PPID/cmdline; echo; echo '--- end'`

// `leases run`'s command runs as pgcoord's own user, so it can read pgcoord's environment
// and command line in /proc. Whichever way the password reaches pgcoord — a URL file, a
// URL in $PGCOORD_DATABASE_URL or in any other variable, PGPASSWORD, a PGPASSFILE, a
// PGSERVICE file, even --database-url — the command finds it neither in its own
// environment nor in pgcoord's /proc/PID/environ and /proc/PID/cmdline; pgcoord connects
// with it all the same (as a role that has that password).
func TestLeasesRunKeepsThePasswordFromTheCommand(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	role, password, u := loginRole(t, d)
	path := "PATH=" + os.Getenv("PATH")
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	libpq := []string{path, "PGHOST=" + u.Hostname(), "PGPORT=" + port, "PGUSER=" + role,
		"PGDATABASE=" + strings.TrimPrefix(u.Path, "/"), "PGSSLMODE=disable"}
	urlFile := secretFile(t, "url", u.String()+"\n")
	passFile := secretFile(t, "pgpass", fmt.Sprintf("%s:%s:%s:%s:%s\n", u.Hostname(), port, strings.TrimPrefix(u.Path, "/"), role, password))
	serviceFile := secretFile(t, "pg_service.conf", fmt.Sprintf("[coord]\nhost=%s\nport=%s\ndbname=%s\nuser=%s\npassword=%s\nsslmode=disable\n",
		u.Hostname(), port, strings.TrimPrefix(u.Path, "/"), role, password))

	for _, c := range []struct {
		how  string
		env  []string
		args []string
	}{
		{"--database-url-file", []string{path}, []string{"--database-url-file", urlFile}},
		{"$PGCOORD_DATABASE_URL", []string{path, cli.EnvDatabaseURL + "=" + u.String()}, nil},
		{"another variable holding the URL", []string{path, "APP_DATABASE_URL=" + u.String()}, []string{"--database-url-file", urlFile}},
		{"PGPASSWORD", append(libpq, "PGPASSWORD="+password), nil},
		{"PGPASSFILE", append(libpq, "PGPASSFILE="+passFile), nil},
		{"PGSERVICE", []string{path, "PGSERVICEFILE=" + serviceFile, "PGSERVICE=coord"}, nil},
		{"--database-url", []string{path}, []string{"--database-url", u.String()}},
	} {
		t.Run(c.how, func(t *testing.T) {
			args := append(c.args, "--schema", d.flags[3], "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", peek)
			code, out, errOut := runProcess(t, c.env, args...)
			if code != cli.ExitOK || !strings.Contains(out, "PGCOORD_FENCE_TOKEN=") || !strings.Contains(out, "--- end") {
				t.Fatalf("leases run with the password from %s = %d\nstdout:\n%s\nstderr:\n%s", c.how, code, out, errOut)
			}
			if strings.Contains(out, password) {
				t.Errorf("the command saw the password given by %s:\n%s", c.how, out)
			}
			// As root (CAP_SYS_PTRACE) the command reads pgcoord's environment, which must
			// then hold no password; any other user is refused it (pgcoord is not dumpable).
			environ, _, _ := strings.Cut(strings.SplitN(out, "--- environ\n", 2)[1], "--- cmdline")
			if os.Geteuid() == 0 && !strings.Contains(environ, "PATH=") {
				t.Errorf("as root the command did not read pgcoord's environment, so this shows nothing:\n%s", out)
			}
			if os.Geteuid() != 0 && environ != "" {
				t.Errorf("a command of the same (non-root) user read pgcoord's environment:\n%s", environ)
			}
			if c.how == "another variable holding the URL" && !strings.Contains(errOut, "not passing APP_DATABASE_URL to the command") {
				t.Errorf("stderr does not say APP_DATABASE_URL was kept from the command: %q", errOut)
			}
			if warned := strings.Contains(errOut, "warning: --database-url holds a password"); warned != (c.how == "--database-url") {
				t.Errorf("password from %s: warned %v, stderr %q", c.how, warned, errOut)
			}
		})
	}
}

// pgcoord is not dumpable while `leases run`'s command runs: a command of the same user
// without CAP_SYS_PTRACE cannot open pgcoord's /proc/PID/environ (nor its memory, which
// holds the password whichever way it came). Run as root, the test runs pgcoord and the
// command as the user nobody, which lacks that capability.
func TestLeasesRunCommandCannotReadPgcoordsMemory(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	_, password, u := loginRole(t, d)
	bin, dir := os.Args[0], ""
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// A copy of the test binary that nobody may run, in a directory nobody may enter.
		var err error
		if dir, err = os.MkdirTemp("", "pgcoord-nobody-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(dir, "pgcoord")
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	script := `if tr '\0' '\n' < /proc/$PPID/environ; then echo READ-ENVIRON; fi`
	cmd := exec.Command(bin, asCLI, "--schema", d.flags[3], "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), cli.EnvDatabaseURL + "=" + u.String()}
	cmd.Dir, cmd.SysProcAttr = dir, &syscall.SysProcAttr{Credential: cred}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("leases run: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	if strings.Contains(out.String(), "READ-ENVIRON") || strings.Contains(out.String(), password) {
		t.Errorf("the command read pgcoord's environment:\n%s", out.String())
	}
	if !strings.Contains(errOut.String(), "Permission denied") {
		t.Errorf("the command was not refused pgcoord's environment: stderr %q", errOut.String())
	}
}

// A password file that group or others may read — which libpq would ignore, and pgx reads
// — draws a warning saying how to fix it; one only its owner may read does not.
func TestLoosePasswordFileWarns(t *testing.T) {
	t.Parallel()
	line := "127.0.0.1:1:db:app:Sekr3t\n"
	for mode, warn := range map[os.FileMode]bool{0o644: true, 0o640: true, 0o600: false, 0o400: false} {
		p := secretFile(t, "pgpass", line)
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		env := []string{"PGHOST=127.0.0.1", "PGPORT=1", "PGUSER=app", "PGDATABASE=db", "PGCONNECT_TIMEOUT=5", "PGPASSFILE=" + p}
		code, _, errOut := runProcess(t, env, "leases", "list")
		got := strings.Contains(errOut, "pgcoord: warning: password file "+p+": group or others may access it") &&
			strings.Contains(errOut, "chmod 600 "+p)
		if code != cli.ExitFailure || got != warn || strings.Contains(errOut, "Sekr3t") {
			t.Errorf("password file of mode %04o: exit %d, warned %v (want %v): %q", mode, code, got, warn, errOut)
		}
	}
}
