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

// secretFile writes content to a file only its owner may read.
func secretFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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

// --database-url-file takes one line from a file only its owner may read: anything else is
// refused as a usage error that shows nothing of the file's content.
func TestDatabaseURLFileIsChecked(t *testing.T) {
	t.Parallel()
	const secret = "postgres://app:Sekr3t@127.0.0.1:1/app"
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--database-url-file", write("shared", secret, 0o644)}, "group or others may access it (mode 0644)"},
		{[]string{"--database-url-file", write("group", secret, 0o640)}, "chmod 600"},
		{[]string{"--database-url-file", write("empty", " \n", 0o600)}, "is empty"},
		{[]string{"--database-url-file", write("two", secret+"\n"+secret+"\n", 0o600)}, "more than one line"},
		{[]string{"--database-url-file", write("big", strings.Repeat("x", 65<<10), 0o600)}, "larger than 64 KiB"},
		{[]string{"--database-url-file", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--database-url-file", dir}, "is a directory"},
		{[]string{"--database-url-file", write("ok", secret, 0o600), "--database-url", secret}, "give one of them"},
	} {
		code, out, errOut := run(t, append(c.args, "leases", "list")...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) || strings.Contains(out+errOut, "Sekr3t") {
			t.Errorf("%v = %d, %q; want a usage error saying %q, without the password", c.args, code, errOut, c.want)
		}
	}
	// A good file is read: the connection fails at port 1, naming the file's user and host.
	code, _, errOut := run(t, "--database-url-file", write("good", "\n  "+secret+"?connect_timeout=5 \n", 0o400), "leases", "list")
	if code != cli.ExitFailure || !strings.Contains(errOut, "app@127.0.0.1:1/app") || strings.Contains(errOut, "Sekr3t") {
		t.Errorf("a good URL file = %d, %q", code, errOut)
	}
}

// A password on the command line draws a warning, in a URL or a key=value string; a
// connection string without one does not.
func TestPasswordOnCommandLineWarns(t *testing.T) {
	t.Parallel()
	for s, warn := range map[string]bool{
		"postgres://app:Sekr3t@127.0.0.1:1/app?connect_timeout=5":                    true,
		"postgres://app@127.0.0.1:1/app?password=Sekr3t&connect_timeout=5":           true,
		"host=127.0.0.1 port=1 user=app password = Sekr3t connect_timeout=5":         true,
		"host=127.0.0.1 port=1 user=app sslpassword=Sekr3t connect_timeout=5":        true,
		"postgres://app@127.0.0.1:1/app?connect_timeout=5":                           false,
		"host=127.0.0.1 port=1 user=app application_name=password connect_timeout=5": false,
	} {
		code, out, errOut := run(t, "--database-url", s, "leases", "list")
		if got := strings.Contains(errOut, "pgcoord: warning: --database-url holds a password"); got != warn || code != cli.ExitFailure {
			t.Errorf("--database-url %q = %d: warned %v, want %v; stderr %q", s, code, got, warn, errOut)
		}
		if strings.Contains(out+errOut, "Sekr3t") {
			t.Errorf("--database-url %q: the output shows the password: %q", s, errOut)
		}
	}
}

// Every output that names the connection — a refused connection string, a failed
// connection (leases list, version, doctor), in a URL or key=value string, from the flag
// or the file — hides a password with '@', ':', '/', '?' or '#' in it, raw or
// percent-encoded, and every piece of it.
func TestMaskedOutputsHideAwkwardPasswords(t *testing.T) {
	t.Parallel()
	enc := strings.NewReplacer("@", "%40", ":", "%3A", "/", "%2F", "?", "%3F", "#", "%23").Replace
	for _, pw := range []string{"Xq@Wv", "Xq:Wv", "Xq/Wv", "9876/Wv", "987?Wv", "987#Wv", "Xq@Wv:Yz/Uk", "Xq/Wv@Yz"} {
		pieces := append([]string{pw, enc(pw)}, strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@:/?#", r) })...)
		for _, conn := range []string{
			"postgres://alice:" + pw + "@127.0.0.1:1/db?connect_timeout=5",
			"postgres://alice:" + enc(pw) + "@127.0.0.1:1/db?connect_timeout=5",
			"postgres://alice:" + enc(pw) + "@127.0.0.1:notaport/db",
			"host=127.0.0.1 port=1 user=alice password='" + pw + "' dbname=db connect_timeout=5",
			"host=127.0.0.1 port=1 user=alice password=" + pw + " dbname=db connect_timeout=5",
			"host=127.0.0.1 port=x user=alice password = " + pw + " dbname=db",
		} {
			for _, src := range [][]string{{"--database-url", conn}, {"--database-url-file", secretFile(t, "url", conn)}} {
				for _, cmd := range [][]string{{"leases", "list"}, {"version"}, {"doctor"}} {
					code, out, errOut := run(t, append(src, cmd...)...)
					if code == cli.ExitOK && cmd[0] != "version" {
						t.Errorf("%v %v succeeded", src, cmd)
					}
					for _, p := range pieces {
						if strings.Contains(out+errOut, p) {
							t.Errorf("%s %q %v shows %q of password %q:\n%s%s", src[0], conn, cmd, p, pw, out, errOut)
							break
						}
					}
				}
			}
		}
	}
}
