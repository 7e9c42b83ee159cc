package idempotency_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// A header value is one key: a list of sf-strings, a string with text after it, and a bad
// escape are refused; so is a request with two Idempotency-Key header lines (400), which
// must not execute under either key.
func TestParseKeyRefusesListsAndRepeatedHeaders(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{`"a", "b"`, `"a","b"`, `"a" "b"`, `"a"b`, `a, b`, `a,b`, `"a\x"`, `"a`, `a"`, `"a", `} {
		if k, err := idempotency.ParseKey(bad); !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %q, %v; want ErrInvalidKey", bad, k, err)
		}
	}
	for in, want := range map[string]string{`"a,b"`: "a,b", `"a b"`: "a b", `"\""`: `"`} {
		if got, err := idempotency.ParseKey(in); err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	pool := pgtest.Pool(t)
	runs := 0
	srv := serve(t, pool, nil, func(w http.ResponseWriter, r *http.Request) { runs++ })
	for _, values := range [][]string{{`"a"`, `"b"`}, {"a", "a"}, {`"a", "b"`}} {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("{}"))
		req.Header["Idempotency-Key"] = values
		if r := do(t, req); r.status != http.StatusBadRequest {
			t.Errorf("Idempotency-Key %q: %d, want 400", values, r.status)
		}
	}
	if runs != 0 || keys(t, pool) != 0 {
		t.Errorf("%d runs, %d keys after refused requests; want none", runs, keys(t, pool))
	}
}
