package audit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/pgcoord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAuditCommitsWithTheAction: an entry recorded in a transaction that rolls back is
// gone with it; one that commits is listed, newest first, with the database's time.
func TestAuditCommitsWithTheAction(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	e := audit.Entry{Actor: "local", RemoteAddr: "127.0.0.1:1", Action: "lease.expire", Target: "a"}
	errUndo := errors.New("the action failed")
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		if _, err := audit.Record(t.Context(), tx, e); err != nil {
			return err
		}
		return errUndo
	})
	if !errors.Is(err, errUndo) {
		t.Fatal(err)
	}
	if es, err := audit.List(t.Context(), pool, nil); err != nil || len(es) != 0 {
		t.Fatalf("after rollback: %v %v, want no entry", es, err)
	}
	first, err := audit.Record(t.Context(), pool, e)
	if err != nil {
		t.Fatal(err)
	}
	e.Target, e.Details = "b", map[string]any{"n": 1}
	second, err := audit.Record(t.Context(), pool, e)
	if err != nil {
		t.Fatal(err)
	}
	es, err := audit.List(t.Context(), pool, nil)
	if err != nil || len(es) != 2 || es[0].ID != second.ID || es[1].ID != first.ID || es[0].Details["n"] != float64(1) ||
		es[1].Details == nil || es[0].At.Before(es[1].At) {
		t.Fatalf("list = %+v, %v; want b then a", es, err)
	}
	page, err := audit.List(t.Context(), pool, &audit.ListOpts{Before: second.ID})
	if err != nil || len(page) != 1 || page[0].Target != "a" {
		t.Fatalf("page before %d = %+v, %v", second.ID, page, err)
	}
	if only, err := audit.List(t.Context(), pool, &audit.ListOpts{Action: "semaphore.set_limit"}); err != nil || len(only) != 0 {
		t.Fatalf("filtered list = %+v, %v", only, err)
	}
}

// TestAuditRejectsBadEntries: bad entries and options fail with their own error before any
// SQL runs (on this unmigrated schema, SQL would fail with another).
func TestAuditRejectsBadEntries(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t) // not migrated: any SQL would fail with another error
	for _, e := range []audit.Entry{
		{Action: "a", Target: "t"},
		{Actor: "x", Target: "t"},
		{Actor: strings.Repeat("x", 256), Action: "a"},
		{Actor: "x", Action: strings.Repeat("a", 101)},
		{Actor: "x", Action: "a", Target: strings.Repeat("t", 1001)},
		{Actor: "x\xff", Action: "a"},
		{Actor: "x", Action: "a", Details: map[string]any{"f": func() {}}},
	} {
		if _, err := audit.Record(t.Context(), pool, e); !errors.Is(err, audit.ErrInvalid) {
			t.Errorf("Record(%+v) = %v, want ErrInvalid", e, err)
		}
	}
	for _, o := range []audit.ListOpts{{Limit: -1}, {Limit: pgcoord.MaxListLimit + 1}, {Before: -1}} {
		if _, err := audit.List(t.Context(), pool, &o); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("List(%+v) = %v, want ErrInvalidArgument", o, err)
		}
	}
}
