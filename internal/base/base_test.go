package base_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// A grant the server refuses because it cannot write is translated to ErrReadOnly, with
// the server's error still reachable; other errors pass through unchanged. (A standby
// refuses the same way: see integration_test/failover_standby_test.go.)
func TestTranslateErrorReadOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT * FROM pgcoord_lease_acquire('report', 'worker', '1 minute')`)
	got := base.TranslateError(err)
	var pgErr *pgconn.PgError
	if !errors.Is(got, pgcoord.ErrReadOnly) || !errors.As(got, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("a grant in a read-only transaction: TranslateError(%v) = %v, want ErrReadOnly wrapping SQLSTATE 25006", err, got)
	}

	_, other := pool.Exec(ctx, `SELECT * FROM pgcoord_lease_acquire('report', 'worker', '-1 minute')`)
	if other == nil || base.TranslateError(other) != other {
		t.Fatalf("TranslateError changed an unrelated error: %v -> %v", other, base.TranslateError(other))
	}
	if base.TranslateError(nil) != nil {
		t.Fatal("TranslateError(nil) is not nil")
	}
}

func TestSyncCommit(t *testing.T) {
	t.Parallel()
	check := base.Check("leases")
	for _, ok := range []string{"", "on", "remote_write", "remote_apply"} {
		if err := check.SyncCommit(ok); err != nil {
			t.Errorf("SyncCommit(%q) = %v, want nil", ok, err)
		}
	}
	// Levels that would make a grant less durable than a local flush, and typos.
	for _, bad := range []string{"off", "local", "ON", "remote", "true"} {
		if err := check.SyncCommit(bad); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("SyncCommit(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestName(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ok   bool
		want string
	}{
		{"orders:42", true, ""},
		{"çà-日本", true, ""},
		{strings.Repeat("x", base.MaxNameLen), true, ""},
		{"", false, "empty"},
		{strings.Repeat("x", base.MaxNameLen+1), false, "maximum"},
		{"bad\xffutf8", false, "UTF-8"},
		{"nul\x00byte", false, "NUL"},
	}
	for _, c := range cases {
		err := base.Check("leases").Name("lease", c.name)
		if c.ok != (err == nil) {
			t.Errorf("Name(%q) = %v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if err != nil && (!errors.Is(err, base.ErrInvalidName) || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "leases: lease name ")) {
			t.Errorf("Name(%q) = %q; want ErrInvalidName reading `leases: lease name ...` and mentioning %q", c.name, err, c.want)
		}
	}
}

// Argument errors read "pkg: cause", wrap their sentinel and what the cause wrapped, and a
// cause that starts with the package's own sentinel is not prefixed twice.
func TestArgErrorText(t *testing.T) {
	t.Parallel()
	check := base.Check("outbox")
	err := check.Invalid("fence token %d is not positive", 0)
	if err.Error() != "outbox: fence token 0 is not positive" || !errors.Is(err, base.ErrInvalidArgument) || errors.Is(err, base.ErrInvalidName) {
		t.Fatalf("Invalid: %q, want \"outbox: fence token 0 is not positive\" wrapping ErrInvalidArgument only", err)
	}
	tooLarge := errors.New("outbox: payload too large")
	err = check.Invalid("%w: %d bytes", tooLarge, 9)
	if err.Error() != "outbox: payload too large: 9 bytes" || !errors.Is(err, tooLarge) || !errors.Is(err, base.ErrInvalidArgument) {
		t.Fatalf("Invalid with a sentinel: %q, want one prefix, wrapping both", err)
	}
	if err := base.Check("").InvalidName("%s name is empty", "lease"); err.Error() != "lease name is empty" || !errors.Is(err, base.ErrInvalidName) {
		t.Fatalf("InvalidName without a package: %q", err)
	}
}
