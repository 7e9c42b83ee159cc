package cli_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// idemKeys creates, in scope "api": "done" (completed, 201 with a JSON body), "old"
// (completed two days ago with a one-day retention), "live" (in flight, held by the
// returned attempt, at recovery point "charged") and "stuck" (in flight at "charged", its
// holder's connection killed).
func idemKeys(t *testing.T, pool *pgxpool.Pool) *idempotency.Attempt {
	t.Helper()
	ctx := context.Background()
	fp := idempotency.Fingerprint("POST", "/orders", []byte("{}"), nil)
	begin := func(key string, opts *idempotency.BeginOpts) *idempotency.Attempt {
		a, err := idempotency.Begin(ctx, pool, "api", key, fp, opts)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	done := begin("done", nil)
	if err := done.Complete(ctx, idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"order":7}`)}); err != nil {
		t.Fatal(err)
	}
	var old *idempotency.Attempt
	pgtest.At(t, pool, time.Now().Add(-48*time.Hour), func() { old = begin("old", &idempotency.BeginOpts{Retention: 24 * time.Hour}) })
	if err := old.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	live := begin("live", nil)
	t.Cleanup(func() { live.Close(context.Background()) })
	stuck := begin("stuck", nil)
	t.Cleanup(func() { stuck.Close(context.Background()) })
	for _, a := range []*idempotency.Attempt{live, stuck} {
		if err := a.Checkpoint(ctx, "charged", nil); err != nil {
			t.Fatal(err)
		}
	}
	// The stuck attempt dies: its key is left as a dead process leaves it, its lease lapsed.
	if _, err := pool.Exec(ctx, `UPDATE pgcoord_idempotency_keys SET holder = 'dead-process', lease_expires_at = pgcoord_now() - interval '1 second'
		WHERE scope = 'api' AND key = 'stuck'`); err != nil {
		t.Fatal(err)
	}
	return live
}

type idemKey struct {
	Scope         string      `json:"scope"`
	Key           string      `json:"key"`
	State         string      `json:"state"`
	Held          bool        `json:"held"`
	Stuck         bool        `json:"stuck"`
	Attempts      int         `json:"attempts"`
	RecoveryPoint *string     `json:"recovery_point"`
	Status        *int        `json:"status"`
	BodyBytes     int         `json:"body_bytes"`
	Headers       http.Header `json:"headers"`
	BodyBase64    *string     `json:"body_base64"`
}

func TestIdempotencyListAndShow(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	idemKeys(t, d.pool)

	code, out, errOut := d.run(t, "idempotency", "list")
	if code != cli.ExitOK || !strings.HasPrefix(out, "SCOPE") {
		t.Fatalf("idempotency list = %d, %q, %q", code, out, errOut)
	}
	for _, want := range []string{"done   completed", "live   in_flight", "stuck  stuck", "charged", "201"} {
		if !strings.Contains(out, want) {
			t.Errorf("idempotency list lacks %q:\n%s", want, out)
		}
	}
	list := func(args ...string) []idemKey {
		t.Helper()
		code, out, errOut := d.run(t, append([]string{"--json", "idempotency", "list"}, args...)...)
		var ks []idemKey
		if err := json.Unmarshal([]byte(out), &ks); code != cli.ExitOK || err != nil || ks == nil {
			t.Fatalf("idempotency list --json %v = %d, %q, %q (%v)", args, code, out, errOut, err)
		}
		return ks
	}
	all := list()
	if len(all) != 4 || all[0].Key != "done" || all[0].Status == nil || *all[0].Status != 201 || all[0].BodyBytes != 11 || all[0].Held {
		t.Errorf("list --json = %+v", all)
	}
	if ks := list("--in-flight"); len(ks) != 2 || ks[0].Key != "live" || !ks[0].Held || ks[0].Stuck || ks[1].Key != "stuck" || !ks[1].Stuck || ks[1].Status != nil {
		t.Errorf("list --in-flight = %+v; want live (held) and stuck", ks)
	}
	if ks := list("--stuck"); len(ks) != 1 || ks[0].Key != "stuck" || *ks[0].RecoveryPoint != "charged" {
		t.Errorf("list --stuck = %+v; want only the key whose holder died", ks)
	}
	code, out, errOut = d.run(t, "idempotency", "list", "--limit", "1")
	if code != cli.ExitOK || strings.Count(out, "\n") != 2 || !strings.Contains(errOut, "there are more") {
		t.Errorf("list --limit 1 = %d, %q, %q", code, out, errOut)
	}

	code, out, _ = d.run(t, "idempotency", "show", "api", "done")
	for _, want := range []string{"state:", "completed", "status:", "201", "Content-Type: application/json", `{"order":7}`} {
		if code != cli.ExitOK || !strings.Contains(out, want) {
			t.Errorf("show api done = %d, lacks %q:\n%s", code, want, out)
		}
	}
	code, out, _ = d.run(t, "--json", "idempotency", "show", "api", "done")
	var k idemKey
	if err := json.Unmarshal([]byte(out), &k); code != cli.ExitOK || err != nil || k.BodyBase64 == nil || k.Headers.Get("Content-Type") != "application/json" {
		t.Fatalf("show --json = %d, %q (%v)", code, out, err)
	}
	if body, _ := base64.StdEncoding.DecodeString(*k.BodyBase64); string(body) != `{"order":7}` {
		t.Errorf("show --json body = %q", body)
	}
	code, out, _ = d.run(t, "--json", "idempotency", "show", "api", "stuck")
	if err := json.Unmarshal([]byte(out), &k); code != cli.ExitOK || err != nil || !k.Stuck || k.BodyBase64 != nil || k.Headers != nil {
		t.Errorf("show --json of the stuck key = %d, %q", code, out)
	}
	if code, _, errOut := d.run(t, "idempotency", "show", "api", "nope"); code != cli.ExitFailure || !strings.Contains(errOut, "no such idempotency key") {
		t.Errorf("show of an unknown key = %d, %q; want exit 1", code, errOut)
	}
}

func TestIdempotencyGC(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	idemKeys(t, d.pool)
	code, out, errOut := d.run(t, "idempotency", "gc", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "1 expired idempotency keys would be deleted") {
		t.Fatalf("gc --dry-run = %d, %q, %q", code, out, errOut)
	}
	code, out, errOut = d.run(t, "--json", "idempotency", "gc", "--tombstone", "1h")
	var r struct {
		Deleted     int64  `json:"deleted"`
		WouldDelete *int64 `json:"would_delete"`
		DryRun      bool   `json:"dry_run"`
	}
	if err := json.Unmarshal([]byte(out), &r); code != cli.ExitOK || err != nil || r.Deleted != 1 || r.WouldDelete != nil || errOut != "" {
		t.Fatalf("gc --json = %d, %q, %q", code, out, errOut)
	}
	var left, tombs int
	if err := d.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pgcoord_idempotency_keys),
		(SELECT count(*) FROM pgcoord_idempotency_tombstones WHERE key = 'old' AND expires_at < now() + interval '61 minutes')`).Scan(&left, &tombs); err != nil {
		t.Fatal(err)
	}
	if left != 3 || tombs != 1 {
		t.Fatalf("after gc: %d keys, %d tombstones of old kept an hour; want 3 and 1", left, tombs)
	}
	// Two more expired keys, collected one per batch: the final line counts both.
	for _, key := range []string{"old-2", "old-3"} {
		pgtest.At(t, d.pool, time.Now().Add(-48*time.Hour), func() {
			a, err := idempotency.Begin(t.Context(), d.pool, "api", key, []byte("fp"), &idempotency.BeginOpts{Retention: 24 * time.Hour})
			if err == nil {
				err = a.Complete(t.Context(), idempotency.Response{Status: 200})
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if code, out, _ := d.run(t, "idempotency", "gc", "--batch", "1"); code != cli.ExitOK ||
		out != "deleted 2 expired idempotency keys in 2 batches (tombstones kept 720h0m0s)\n" {
		t.Errorf("second gc = %d, %q", code, out)
	}
	if code, out, _ := d.run(t, "idempotency", "gc"); code != cli.ExitOK || !strings.HasPrefix(out, "deleted 0 expired idempotency keys") {
		t.Errorf("third gc = %d, %q", code, out)
	}
}

func TestIdempotencyUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"idempotency", "list", "--in-flight", "--stuck"},
		{"idempotency", "list", "--limit", "0"},
		{"idempotency", "show", "api"},
		{"idempotency", "show", "api", "bad\tkey"},
		{"idempotency", "show", "", "k"},
		{"idempotency", "gc", "--batch", "0"},
		{"idempotency", "gc", "--tombstone", "0s"},
		{"idempotency", "bogus"},
	} {
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
	}
}
