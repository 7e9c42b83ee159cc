package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/dedupe"
	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// dedupeClaims claims n keys "prefix-i" of scope "cli" in one transaction, with opts.
func dedupeClaims(t *testing.T, pool *pgxpool.Pool, prefix string, n int, opts *dedupe.ClaimOpts) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		for i := range n {
			ok, err := dedupe.Claim(t.Context(), tx, "cli", fmt.Sprintf("%s-%d", prefix, i), opts)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s-%d was already claimed", prefix, i)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func countClaims(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pgcoord_dedupe`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// gcResult is the --json output of `dedupe gc`.
type gcResult struct {
	Deleted     int64  `json:"deleted"`
	WouldDelete *int64 `json:"would_delete"`
	DryRun      bool   `json:"dry_run"`
}

func decodeGC(t *testing.T, out string) gcResult {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw) != 3 {
		t.Fatalf("dedupe gc --json printed %q: want an object with deleted, would_delete, dry_run (%v)", out, err)
	}
	var r gcResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// gc deletes only the expired claims; --dry-run counts them and deletes nothing.
func TestDedupeGC(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	pgtest.At(t, d.pool, time.Now().Add(-2*time.Hour), func() {
		dedupeClaims(t, d.pool, "expired", 5, &dedupe.ClaimOpts{Retention: time.Hour})
	})
	dedupeClaims(t, d.pool, "live", 2, &dedupe.ClaimOpts{Retention: time.Hour})
	dedupeClaims(t, d.pool, "forever", 1, nil)

	code, out, errOut := d.run(t, "dedupe", "gc", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "5 expired dedupe claims would be deleted") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("dedupe gc --dry-run = %d, %q, %q", code, out, errOut)
	}
	code, out, errOut = d.run(t, "--json", "dedupe", "gc", "--dry-run")
	if r := decodeGC(t, out); code != cli.ExitOK || r.Deleted != 0 || r.WouldDelete == nil || *r.WouldDelete != 5 || !r.DryRun {
		t.Fatalf("dedupe gc --dry-run --json = %d, %q, %q", code, out, errOut)
	}
	if n := countClaims(t, d.pool); n != 8 {
		t.Fatalf("a dry run deleted claims: %d left of 8", n)
	}

	code, out, errOut = d.run(t, "--json", "dedupe", "gc", "--batch", "2")
	if r := decodeGC(t, out); code != cli.ExitOK || r.Deleted != 5 || r.WouldDelete != nil || r.DryRun {
		t.Fatalf("dedupe gc --batch 2 --json = %d, %q, %q; want 5 deleted", code, out, errOut)
	}
	if errOut != "" {
		t.Errorf("progress on stderr although it is not a terminal: %q", errOut)
	}
	if n := countClaims(t, d.pool); n != 3 {
		t.Fatalf("%d claims left, want the 2 live and the 1 kept forever", n)
	}
	code, out, _ = d.run(t, "dedupe", "gc")
	if code != cli.ExitOK || strings.TrimSpace(out) != "deleted 0 expired dedupe claims" {
		t.Fatalf("second dedupe gc = %d, %q", code, out)
	}
}

func TestDedupeGCUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dedupe", "gc", "--batch", "0"},
		{"dedupe", "gc", "--batch", "100001"},
		{"dedupe", "gc", "--batch", "many"},
		{"dedupe", "gc", "extra"},
		{"dedupe", "gc", "--bogus"},
		{"dedupe", "bogus"},
	} {
		// No database is needed: usage errors are found before connecting.
		code, _, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errOut)
		}
	}
}
