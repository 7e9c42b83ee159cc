package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// sqlState returns the SQLSTATE of the *pgconn.PgError in err's chain, or "" when there is
// none: an error made in Go, before any SQL ran.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// mustBegin begins an attempt that holds (scope, key).
func mustBegin(t *testing.T, pool *pgxpool.Pool, scope, key string) *idempotency.Attempt {
	t.Helper()
	a, err := idempotency.Begin(t.Context(), pool, scope, key, fp, nil)
	if err != nil || a.Replay() != nil {
		t.Fatalf("Begin(%s/%s) = %v, %v; want an attempt holding the key", scope, key, a, err)
	}
	t.Cleanup(func() { a.Close(t.Context()) })
	return a
}

// storedHeadersLen is the length PostgreSQL gives h stored as the key row's jsonb: the
// measure pgcoord_idempotency_complete bounds.
func storedHeadersLen(t *testing.T, pool *pgxpool.Pool, h http.Header) int {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return queryInt(t, pool, `SELECT octet_length($1::jsonb::text)`, json.RawMessage(b))
}

// Complete refuses a response the store cannot keep before any SQL runs (the error carries
// no SQLSTATE), rolls the attempt back and leaves the key free; a status the store keeps
// (100 to 999, net/http's range) is stored, also above 599.
func TestCompleteRefusesWhatTheStoreCannotKeep(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	for _, c := range []struct {
		name string
		resp idempotency.Response
	}{
		{"status 99", idempotency.Response{Status: 99}},
		{"status 1000", idempotency.Response{Status: 1000}},
		{"NUL in a header value", idempotency.Response{Status: 200, Header: http.Header{"Location": {"/a\x00b"}}}},
		{"NUL in a header name", idempotency.Response{Status: 200, Header: http.Header{"X-\x00": {"v"}}}},
	} {
		a := mustBegin(t, pool, "limits", c.name)
		err := a.Complete(ctx, c.resp)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) || sqlState(err) != "" || errors.Is(err, idempotency.ErrLost) {
			t.Errorf("%s: Complete = %v; want an error wrapping ErrInvalidArgument, made before any SQL", c.name, err)
		}
		// Rolled back: the next attempt holds the key, as its first.
		b := mustBegin(t, pool, "limits", c.name)
		if b.Attempts() != 1 {
			t.Errorf("%s: the next attempt is attempt %d, want 1: something was stored", c.name, b.Attempts())
		}
		b.Close(ctx) // give its connection back
	}
	a := mustBegin(t, pool, "limits", "status 799")
	if err := a.Complete(ctx, idempotency.Response{Status: 799, Body: []byte("odd")}); err != nil {
		t.Fatalf("Complete with status 799: %v", err)
	}
	r, err := idempotency.Begin(ctx, pool, "limits", "status 799", fp, nil)
	if err != nil || r.Replay() == nil || r.Replay().Status != 799 {
		t.Fatalf("replay of status 799 = %+v, %v", r, err)
	}
}

// The stored headers are bounded as PostgreSQL measures them (the jsonb printed as text):
// Go computes the same length, escapes and invalid UTF-8 included, so headers at the bound
// are stored and headers a byte over are refused before any SQL runs, as plain SQL refuses
// them.
func TestStoredHeadersBound(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	h := http.Header{
		"Location": {`/a"b\c`, "tab\there", "\b\f\n\r", "\x01\x1f\x7f", "é😀\u2028<>&", "bad \xff\xfe utf-8", ""},
		"X-Nil":    nil,
		"X-Empty":  {},
		`X-"ké"`:   {"v"},
		"X-Pad":    {""},
	}
	h["X-Pad"][0] = strings.Repeat("a", idempotency.MaxStoredHeaderBytes-storedHeadersLen(t, pool, h))
	if n := storedHeadersLen(t, pool, h); n != idempotency.MaxStoredHeaderBytes {
		t.Fatalf("padded headers take %d bytes, want %d", n, idempotency.MaxStoredHeaderBytes)
	}

	a := mustBegin(t, pool, "headers", "at-the-bound")
	if err := a.Complete(ctx, idempotency.Response{Status: 201, Header: h}); err != nil {
		t.Fatalf("Complete with headers of exactly %d bytes: %v", idempotency.MaxStoredHeaderBytes, err)
	}
	r, err := idempotency.Begin(ctx, pool, "headers", "at-the-bound", fp, nil)
	if err != nil || r.Replay() == nil || r.Replay().Header.Get("Location") != h.Get("Location") ||
		len(r.Replay().Header.Get("X-Pad")) != len(h.Get("X-Pad")) {
		t.Fatalf("replay = %+v, %v; want the stored headers", r, err)
	}

	h["X-Pad"][0] += "a"
	a = mustBegin(t, pool, "headers", "over-the-bound")
	err = a.Complete(ctx, idempotency.Response{Status: 201, Header: h})
	if !errors.Is(err, idempotency.ErrTooLarge) || !errors.Is(err, pgcoord.ErrInvalidArgument) || sqlState(err) != "" {
		t.Fatalf("Complete with headers a byte over the bound: %v; want ErrTooLarge and ErrInvalidArgument, before any SQL", err)
	}
	next := mustBegin(t, pool, "headers", "over-the-bound")
	if next.Attempts() != 1 {
		t.Fatalf("the next attempt is attempt %d, want 1: something was stored", next.Attempts())
	}
	next.Close(ctx)

	// Plain SQL refuses the same headers.
	b, _ := json.Marshal(h)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgcoord_idempotency_claim('headers', 'sql', $1, 'h', '1 day', '1 minute')`, fp); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pgcoord_idempotency_complete('headers', 'sql', 'h', 201, $1::jsonb, NULL)`, json.RawMessage(b))
		return err
	})
	if sqlState(err) != "22023" {
		t.Fatalf("pgcoord_idempotency_complete with the same headers: %v; want SQLSTATE 22023", err)
	}
}

// Checkpoint refuses a bad recovery point or oversize data before any SQL runs, and the
// attempt goes on holding its key: its next Checkpoint, with data at the bound, and its
// Complete succeed.
func TestCheckpointRefusesBadInputAndKeepsTheKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a := mustBegin(t, pool, "phases", "k")
	for _, point := range []string{"", strings.Repeat("p", pgcoord.MaxNameLen+1), "nul\x00", "\xff"} {
		err := a.Checkpoint(ctx, point, nil)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) || !errors.Is(err, pgcoord.ErrInvalidName) || sqlState(err) != "" {
			t.Errorf("Checkpoint(%q) = %v; want ErrInvalidArgument and ErrInvalidName, before any SQL", point, err)
		}
	}
	over := make([]byte, idempotency.MaxRecoveryDataBytes+1)
	if err := a.Checkpoint(ctx, "charged", over); !errors.Is(err, pgcoord.ErrInvalidArgument) || sqlState(err) != "" {
		t.Errorf("Checkpoint with %d bytes of data = %v; want ErrInvalidArgument, before any SQL", len(over), err)
	}
	data := bytes.Repeat([]byte{7}, idempotency.MaxRecoveryDataBytes)
	if err := a.Checkpoint(ctx, "charged", data); err != nil {
		t.Fatalf("Checkpoint after refused ones, with data at the bound: %v", err)
	}
	if point, got := a.RecoveryPoint(); point != "charged" || !bytes.Equal(got, data) {
		t.Fatalf("recovery point %q with %d bytes", point, len(got))
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}

	// Plain SQL refuses oversize data too.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgcoord_idempotency_claim('phases', 'sql', $1, 'h', '1 day', '1 minute')`, fp); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pgcoord_idempotency_checkpoint('phases', 'sql', 'h', 'charged', $1)`, over)
		return err
	})
	if sqlState(err) != "22023" {
		t.Fatalf("pgcoord_idempotency_checkpoint with %d bytes: %v; want SQLSTATE 22023", len(over), err)
	}
}
