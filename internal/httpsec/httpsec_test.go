package httpsec

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Issue 28, Medium 6: weak tokens are refused, saying how to make a good one; tokens from
// `openssl rand` pass.
func TestTokenStrength(t *testing.T) {
	t.Parallel()
	for _, weak := range []string{
		strings.Repeat("a", 32), // one character repeated
		strings.Repeat("a", 100),
		"0123456789abcdef0123456789abcdef", // a string repeated
		strings.Repeat("s3cret", 10),
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", // a run of neighbours
		"s3cret", "", "12345678901234567890123456789012345678", // too short for its alphabet (digits: 126 bits)
		"correcthorsebatterystaple",       // lower-case letters: 117 bits at most
		"18a05998cd6a1fe61d0e41c9600fbc8", // 31 hex digits: 124 bits
		"18a05998cd6a1fe61d0e41c9600fbc8\x1b", "18a05998cd6a1fe61d0e 41c9600fbc8b",
		strings.Repeat("18a05998cd6a1fe61d0e41c9600fbc8b", 16) + "x", // over MaxTokenLen
	} {
		err := CheckToken(weak)
		if !errors.Is(err, ErrWeakToken) || !strings.Contains(err.Error(), "openssl rand -hex 32") {
			t.Errorf("CheckToken(%q) = %v, want ErrWeakToken saying how to make one", weak, err)
		}
	}
	for _, good := range []string{
		"18a05998cd6a1fe61d0e41c9600fbc8b", "4483489c2336e7931245ea3a829eb543", // openssl rand -hex 16
		"8C7E230A8DA213953055C6444B6D2494",
		"e28663961f5f56d246ce73b51df13ffc0c7ce669a3054ff7b1a1a132cc1d83a2", // openssl rand -hex 32
		"TIMBiLiOeP9IPXuS8OG5u0AhCj8A0gaz",                                 // openssl rand -base64 24
	} {
		if err := CheckToken(good); err != nil {
			t.Errorf("CheckToken(%q) = %v, want nil", good, err)
		}
	}
}

// Issue 28, Medium 6: a rebound name is refused without a token; loopback names at the
// served port are not.
func TestHostAllowed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		host, served string
		token, want  bool
	}{
		{"rebind.attacker.example", "127.0.0.1:9190", false, false},
		{"rebind.attacker.example:9190", "127.0.0.1:9190", false, false},
		{"127.0.0.1.attacker.example:9190", "127.0.0.1:9190", false, false},
		{"localhost:9191", "127.0.0.1:9190", false, false},
		{"", "127.0.0.1:9190", false, false},
		{"localhost:9190", "127.0.0.1:9190", false, true},
		{"LOCALHOST:9190", "127.0.0.1:9190", false, true},
		{"127.0.0.1:9190", "127.0.0.1:9190", false, true},
		{"[::1]:9190", "127.0.0.1:9190", false, true},
		{"127.0.0.1:5555", "127.0.0.1:0", false, true},
		{"rebind.attacker.example", "0.0.0.0:9190", true, true},
	} {
		if got := HostAllowed(c.host, c.served, c.token); got != c.want {
			t.Errorf("HostAllowed(%q, %q, token %v) = %v, want %v", c.host, c.served, c.token, got, c.want)
		}
	}
}

// Issue 28, Low: a slowloris client — one that sends its request's headers a byte at a
// time and never ends them — is disconnected past the header timeout, and headers over
// the cap are refused.
func TestServerDisconnectsSlowloris(t *testing.T) {
	saved := limits
	t.Cleanup(func() { limits = saved })
	limits.readHeader, limits.read = 200*time.Millisecond, 400*time.Millisecond

	var served atomic.Int64
	srv := NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closed := make(chan error, 1)
	go func() { // the server's side: whatever it answers, then the end of the connection
		_, err := bufio.NewReader(conn).ReadString(0)
		closed <- err
	}()
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")); err != nil {
		t.Fatal(err)
	}
	start, sent := time.Now(), 0
	for {
		select {
		case err := <-closed:
			if served.Load() != 0 {
				t.Fatal("the handler ran for a request whose headers never ended")
			}
			t.Logf("disconnected after %d bytes sent one by one over %s: %v", sent, time.Since(start), err)
			goto capped
		default:
		}
		if time.Since(start) > pgtest.WaitLimit {
			t.Fatalf("a client sending a header byte by byte for %s (%d bytes) is still connected", pgtest.WaitLimit, sent)
		}
		if _, err := conn.Write([]byte("a")); err == nil {
			sent++
		}
		time.Sleep(20 * time.Millisecond) // the client's pace, not an assertion
	}
capped:
	big, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	big.Header.Set("X-Big", strings.Repeat("b", 2*limits.maxHeaderBytes))
	resp, err := http.DefaultClient.Do(big)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a request with %d bytes of headers = %d, want 431", 2*limits.maxHeaderBytes, resp.StatusCode)
	}
}

// Every HTTP server of pgcoord's commands is NewServer's; an example (meant to be copied
// out of this module) sets the same four bounds itself.
func TestEveryServerIsBounded(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == filepath.Join("internal", "httpsec", "httpsec.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		for i := strings.Index(src, "http.Server{"); i >= 0; i = next(src, i) {
			found++
			lit := src[i:]
			if end := strings.Index(lit, "}"); end >= 0 {
				lit = lit[:end]
			}
			if !strings.HasPrefix(rel, "examples"+string(filepath.Separator)) {
				t.Errorf("%s builds an http.Server itself: use httpsec.NewServer", rel)
				continue
			}
			for _, f := range []string{"ReadHeaderTimeout", "ReadTimeout", "IdleTimeout", "MaxHeaderBytes"} {
				if !strings.Contains(lit, f+":") {
					t.Errorf("%s: an http.Server without %s", rel, f)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("found no http.Server at all: is the walk looking at the module?")
	}
}

func next(src string, i int) int {
	j := strings.Index(src[i+1:], "http.Server{")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}
