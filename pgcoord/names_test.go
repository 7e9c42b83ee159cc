package pgcoord_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// A name carrying terminal escapes (a window title, a screen clear, a newline that fakes a
// table row, a bidirectional override) is refused by the Go library and by the SQL API
// alike, so it never reaches a table the CLI or the dashboard prints.
func TestNamesRefuseControlCharacters(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for _, name := range []string{
		"job\x1b]0;pwned\x07", "job\x1b[2J", "job\nlease-2  held  me", "tab\there", "del\x7f",
		"c1\u0085", "rtl\u202egpj.exe", "sep\u2028x",
	} {
		_, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil)
		if !errors.Is(err, pgcoord.ErrInvalidName) || !strings.Contains(err.Error(), "control character") {
			t.Errorf("leases.TryAcquire(%q) = %v, want ErrInvalidName naming the control character", name, err)
		}
		_, err = pool.Exec(ctx, `SELECT pgcoord_lease_acquire($1, 'h', '1 minute')`, name)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, "control character") {
			t.Errorf("pgcoord_lease_acquire(%q) = %v, want SQLSTATE 22023 naming the control character", name, err)
		}
	}
	// Printable names of any script, with spaces and punctuation, stay valid.
	for _, name := range []string{"weekly report", "orders:42/çà-日本", "emoji 🚀"} {
		if _, err := leases.TryAcquire(ctx, pool, name, time.Minute, nil); err != nil {
			t.Errorf("leases.TryAcquire(%q) = %v, want a lease", name, err)
		}
	}
}
