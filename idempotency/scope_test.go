package idempotency_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Two clients with different credentials who send the same key and the same body must
// each get their own response. A config that does not say how keys are scoped is refused,
// since one scope for every client handed the second client the first one's stored
// response, card digits included.
func TestMiddlewareKeepsClientsApart(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, cfg := range []*idempotency.Config{nil, {}, {Atomic: true}} {
		if _, err := idempotency.Middleware(pool, cfg); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "Scope") {
			t.Fatalf("Middleware(%+v) = %v, want ErrInvalidArgument asking for a Scope", cfg, err)
		}
	}

	var charges atomic.Int64
	srv := serve(t, pool, &idempotency.Config{
		Scope: func(r *http.Request) (string, error) { return "user:" + r.Header.Get("Authorization"), nil },
	}, func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"card":"%s"}`, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	}).URL
	pay := func(who string) string {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv+"/pay", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "pay-1")
		req.Header.Set("Authorization", "Bearer "+who)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := pay("alice-4242"); !strings.Contains(got, "alice-4242") {
		t.Fatalf("alice got %q", got)
	}
	if got := pay("bob-1111"); strings.Contains(got, "alice") || !strings.Contains(got, "bob-1111") {
		t.Fatalf("bob, with alice's key and body, got %q: want his own response", got)
	}
	if got := pay("alice-4242"); !strings.Contains(got, "alice-4242") || charges.Load() != 2 {
		t.Fatalf("alice's retry got %q after %d charges, want her stored response and 2 charges", got, charges.Load())
	}
}
