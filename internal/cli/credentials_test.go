package cli_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// secretFile writes content to a file only its owner may read.
func secretFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// shows reports whether output shows piece of a password. A piece made only of digits,
// such as "987", counts only where it stands alone: inside a longer word, such as a
// relay's name ("vm/29879/7e9101d5fcc2"), a random port or a temporary path, it is
// chance, not a leak.
func shows(output, piece string) bool {
	if strings.Trim(piece, "0123456789") != "" {
		return strings.Contains(output, piece)
	}
	return regexp.MustCompile(`(^|[^0-9A-Za-z])` + piece + `($|[^0-9A-Za-z])`).MatchString(output)
}

func TestShowsFindsDigitsOnlyWhereTheyStandAlone(t *testing.T) {
	t.Parallel()
	for out, want := range map[string]bool{
		"http://alice:987@host": true, "987": true, "port 987.": true, "pw=Xq": true,
		"relay vm/29879/7e9101d5fcc2": false, "127.0.0.1:46987": false, "/tmp/x9873/url": false, "pw=Xz": false,
	} {
		p := "987"
		if strings.HasPrefix(out, "pw=") {
			p = "Xq"
		}
		if got := shows(out, p); got != want {
			t.Errorf("shows(%q, %q) = %v, want %v", out, p, got, want)
		}
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
					// Errors name the file's path on purpose, so it is left out.
					shown := out + errOut
					if src[0] == "--database-url-file" {
						shown = strings.ReplaceAll(shown, src[1], "FILE")
					}
					for _, p := range pieces {
						if shows(shown, p) {
							t.Errorf("%s %q %v shows %q of password %q:\n%s%s", src[0], conn, cmd, p, pw, out, errOut)
							break
						}
					}
				}
			}
		}
	}
}

// A webhook URL whose password holds '@', ':', '/', '?' or '#' reaches the endpoint with
// that password when it parses for sure (percent-encoded, or a raw '@' or ':'), and the
// relay's start line shows none of it; when a raw '/', '?' or '#' moves part of the
// password into the host or path, the relay refuses the URL (exit 2) without showing it.
func TestOutboxRelayWebhookAwkwardPasswords(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	var mu sync.Mutex
	var got []string // the passwords the endpoint was sent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pw, _ := r.BasicAuth()
		mu.Lock()
		got = append(got, pw)
		mu.Unlock()
	}))
	defer srv.Close()
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	enc := strings.NewReplacer("@", "%40", ":", "%3A", "/", "%2F", "?", "%3F", "#", "%23").Replace
	for _, pw := range []string{"Xq@Wv", "Xq:Wv", "Xq/Wv", "9876/Wv", "987?Wv", "987#Wv", "Xq@Wv:Yz/Uk", "Xq/Wv@Yz"} {
		pieces := append([]string{pw, enc(pw)}, strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@:/?#", r) })...)
		for _, form := range []string{pw, enc(pw)} {
			sinkURL := "http://alice:" + form + "@" + hostPort + "/in?api_key=k3y"
			args := []string{"outbox", "relay", "--sink", "webhook=" + sinkURL, "--poll-interval", "50ms"}
			var r result
			if strings.ContainsAny(form, "/?#") {
				// Accepted, the relay would run until stopped: await fails the test then.
				ctx, stop := context.WithCancel(t.Context())
				r = await(t, d.start(ctx, args...), progressLimit)
				stop()
				if r.code != cli.ExitUsage || !strings.Contains(r.errOut, "percent-encode") {
					t.Errorf("webhook %q = %d, %q: want a usage error", sinkURL, r.code, r.errOut)
				}
			} else {
				mu.Lock()
				got = nil
				mu.Unlock()
				obEnqueue(t, d.pool, obMsg("orders", "o-1", `{"n":1}`))
				ctx, stop := context.WithCancel(t.Context())
				ch := d.start(ctx, args...)
				waitFor(t, pgtest.WaitLimit, "the message delivered", func() bool {
					s, err := outbox.Stats(t.Context(), d.pool, nil)
					return err == nil && len(s) == 0
				})
				stop()
				r = await(t, ch, pgtest.WaitLimit)
				mu.Lock()
				if len(got) != 1 || got[0] != pw || r.code != cli.ExitOK || !strings.Contains(r.errOut, "delivering to webhook http://REDACTED@"+hostPort+"/in") {
					t.Errorf("webhook %q: exit %d, the endpoint got passwords %q, want [%q]; stderr %q", sinkURL, r.code, got, pw, r.errOut)
				}
				mu.Unlock()
			}
			for _, p := range append(pieces, "k3y") {
				if shows(r.out+r.errOut, p) {
					t.Errorf("webhook %q: the output shows %q:\n%s%s", sinkURL, p, r.out, r.errOut)
					break
				}
			}
		}
	}
}
