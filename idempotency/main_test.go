package idempotency_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testScope is the scope of every key in tests whose Config sets none: their clients are
// one principal.
const testScope = "http"

// oneScope puts every request in testScope.
func oneScope(*http.Request) (string, error) { return testScope, nil }

// reply is an HTTP response as a test sees it.
type reply struct {
	status int
	header http.Header
	body   string
}

// serve starts a loopback HTTP server running h behind the middleware with cfg.
func serve(t *testing.T, pool *pgxpool.Pool, cfg *idempotency.Config, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	if cfg == nil {
		cfg = &idempotency.Config{}
	}
	if cfg.Scope == nil {
		c := *cfg
		c.Scope = oneScope
		cfg = &c
	}
	mw, err := idempotency.Middleware(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv
}

// send sends method url with body and, if key is not empty, the Idempotency-Key header.
func send(t testing.TB, method, url, key, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return do(t, req)
}

// do sends req and reads the whole response.
func do(t testing.TB, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// queryInt runs a query returning one integer.
func queryInt(t testing.TB, db pgcoord.DBTX, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// exec runs sql on db and fails t on error.
func exec(t testing.TB, db pgcoord.DBTX, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// keys counts the stored key rows.
func keys(t testing.TB, pool *pgxpool.Pool) int {
	return queryInt(t, pool, `SELECT count(*) FROM pgcoord_idempotency_keys`)
}

// deadHolder leaves (scope, key) as a process that claimed it and died leaves it: in
// flight for a holder that will never renew its lease, at the recovery point point (if
// not empty), with its lease lapsed by the database clock.
func deadHolder(t testing.TB, pool *pgxpool.Pool, scope, key string, fingerprint []byte, point string) {
	t.Helper()
	exec(t, pool, `SELECT FROM pgcoord_idempotency_claim($1, $2, $3, 'dead-process', '1 day', '1 minute')`, scope, key, fingerprint)
	if point != "" {
		exec(t, pool, `SELECT FROM pgcoord_idempotency_checkpoint($1, $2, 'dead-process', $3, 'ch_123')`, scope, key, point)
	}
	exec(t, pool, `UPDATE pgcoord_idempotency_keys SET lease_expires_at = pgcoord_now() - interval '1 second'
		WHERE scope = $1 AND key = $2`, scope, key)
}
