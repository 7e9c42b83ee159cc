package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var fp = idempotency.Fingerprint("POST", "/charges", []byte(`{"amount":10}`), nil)

// A holder that dies (it claimed the key, perhaps recorded a recovery point, and stopped
// renewing its lease) leaves a key in flight until its lease lapses; the next attempt then
// takes it over: from scratch if it recorded no recovery point, from its last one if it
// did. A live holder's key is refused as in flight, and a live holder that gives up
// (Close) lets the next attempt execute at once.
func TestDeadHolderTakenOverAfterItsLease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	for _, point := range []string{"", "charged"} {
		key := "no-checkpoint"
		if point != "" {
			key = "checkpoint"
		}
		deadHolder(t, pool, "pay", key, fp, point)
		b, err := idempotency.Begin(ctx, pool, "pay", key, fp, nil)
		if err != nil || b.Replay() != nil {
			t.Fatalf("%s: Begin after the holder's lease lapsed = %v; want the key taken over", key, err)
		}
		got, data := b.RecoveryPoint()
		if b.Attempts() != 2 || got != point || (point != "" && string(data) != "ch_123") {
			t.Errorf("%s: took over as attempt %d at %q %q; want attempt 2 resuming from %q", key, b.Attempts(), got, data, point)
		}
		if _, err := idempotency.Begin(ctx, pool, "pay", key, fp, nil); !errors.Is(err, idempotency.ErrInFlight) {
			t.Fatalf("%s: repeat while the new holder is alive: %v, want ErrInFlight", key, err)
		}
		if err := b.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("done")}); err != nil {
			t.Fatal(err)
		}
		r, err := idempotency.Begin(ctx, pool, "pay", key, fp, nil)
		if err != nil || r.Replay() == nil || string(r.Replay().Body) != "done" {
			t.Fatalf("%s: after recovery: %v, %v; want the recovered attempt's response", key, r, err)
		}
	}
	// A holder whose lease lapsed while it was alive (it could not renew) loses the key to
	// the next attempt: its Checkpoint and Complete return ErrLost and store nothing.
	a, err := idempotency.Begin(ctx, pool, "pay", "lapsed", fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `UPDATE pgcoord_idempotency_keys SET lease_expires_at = pgcoord_now() - interval '1 second' WHERE key = 'lapsed'`)
	b, err := idempotency.Begin(ctx, pool, "pay", "lapsed", fp, nil)
	if err != nil || b.Replay() != nil {
		t.Fatalf("Begin after a lapsed lease = %v", err)
	}
	if err := a.Checkpoint(ctx, "late", nil); !errors.Is(err, idempotency.ErrLost) {
		t.Errorf("Checkpoint of the holder that lost the key: %v, want ErrLost", err)
	}
	a.Close(ctx) // must not disturb the new holder
	if err := b.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	// A live holder that gives up: the next attempt executes at once, from the start.
	a, err = idempotency.Begin(ctx, pool, "pay", "given-up", fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Close(ctx)
	b, err = idempotency.Begin(ctx, pool, "pay", "given-up", fp, nil)
	if err != nil || b.Attempts() != 1 {
		t.Fatalf("Begin after the holder gave up = %v, %v; want a first attempt at once", b, err)
	}
	b.Close(ctx)
}

// Stuck keys (in flight, holder dead, not yet recovered) are listed as such.
func TestListAndGet(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	done, err := idempotency.Begin(ctx, pool, "s", "done", fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Complete(ctx, idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	live, _ := idempotency.Begin(ctx, pool, "s", "live", fp, nil)
	defer live.Close(ctx)
	if err := live.Checkpoint(ctx, "step1", nil); err != nil {
		t.Fatal(err)
	}
	deadHolder(t, pool, "s", "stuck", fp, "step1")

	names := func(opts *idempotency.ListOpts) []string {
		ks, err := idempotency.List(ctx, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range ks {
			out = append(out, k.Key)
		}
		return out
	}
	if got := names(nil); !slices.Equal(got, []string{"done", "live", "stuck"}) {
		t.Errorf("List = %v", got)
	}
	if got := names(&idempotency.ListOpts{InFlight: true}); !slices.Equal(got, []string{"live", "stuck"}) {
		t.Errorf("List in flight = %v", got)
	}
	if got := names(&idempotency.ListOpts{Stuck: true}); !slices.Equal(got, []string{"stuck"}) {
		t.Errorf("List stuck = %v", got)
	}
	if got := names(&idempotency.ListOpts{AfterScope: "s", AfterKey: "done", Limit: 1}); !slices.Equal(got, []string{"live"}) {
		t.Errorf("List page = %v", got)
	}
	k, err := idempotency.Get(ctx, pool, "s", "done")
	if err != nil || k.State != idempotency.StateCompleted || k.Response == nil || string(k.Response.Body) != "ok" ||
		k.Response.Header.Get("Content-Type") != "text/plain" || k.Stuck() || k.Held {
		t.Errorf("Get done = %+v, %v", k, err)
	}
	k, err = idempotency.Get(ctx, pool, "s", "live")
	if err != nil || !k.Held || k.Stuck() || k.RecoveryPoint != "step1" || k.Response != nil {
		t.Errorf("Get live = %+v, %v", k, err)
	}
	if _, err := idempotency.Get(ctx, pool, "s", "nope"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("Get of an unknown key: %v", err)
	}
}

// GC deletes only expired keys, in batches, leaving tombstones; a dry run deletes nothing.
func TestGC(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	for i := range 4 {
		if i < 3 {
			clock.Run(-48 * time.Hour) // three keys made two days ago, kept a day
		} else {
			clock.Run(0)
		}
		a, err := idempotency.Begin(ctx, pool, "gc", string(rune('a'+i)), fp, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	var progress []int64
	n, err := idempotency.GC(ctx, pool, &idempotency.GCOpts{DryRun: true, Progress: func(d int64) { progress = append(progress, d) }})
	if err != nil || n != 3 || keys(t, pool) != 4 || !slices.Equal(progress, []int64{3}) {
		t.Fatalf("dry run = %d, %v, %v; want 3 counted, none deleted", n, err, progress)
	}
	progress = nil
	n, err = idempotency.GC(ctx, pool, &idempotency.GCOpts{Batch: 2, Progress: func(d int64) { progress = append(progress, d) }})
	if err != nil || n != 3 || keys(t, pool) != 1 || !slices.Equal(progress, []int64{2, 3}) {
		t.Fatalf("GC = %d, %v, progress %v, %d keys left; want 3 deleted in batches of 2", n, err, progress, keys(t, pool))
	}
	if tomb := queryInt(t, pool, `SELECT count(*) FROM pgcoord_idempotency_tombstones WHERE expires_at > now() + interval '29 days'`); tomb != 3 {
		t.Fatalf("%d tombstones kept 30 days, want 3", tomb)
	}
	if _, err := idempotency.Begin(ctx, pool, "gc", "a", fp, nil); !errors.Is(err, idempotency.ErrExpired) {
		t.Fatalf("Begin of a tombstoned key: %v, want ErrExpired", err)
	}
	if _, err := idempotency.Begin(ctx, pool, "gc", "a", []byte("another request"), nil); !errors.Is(err, idempotency.ErrExpired) {
		t.Fatalf("Begin of a tombstoned key, other request: %v, want ErrExpired", err)
	}
}

// A completed key refuses another fingerprint; Complete refuses what it cannot store and
// leaves the key free.
func TestBeginMismatchAndComplete(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a, err := idempotency.Begin(ctx, pool, "m", "k", fp, &idempotency.BeginOpts{MaxResponseBytes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("four")}); !errors.Is(err, idempotency.ErrTooLarge) {
		t.Fatalf("Complete of 4 bytes over a limit of 3: %v", err)
	}
	if keys(t, pool) != 0 {
		t.Fatal("an oversize response left a key behind")
	}
	a, err = idempotency.Begin(ctx, pool, "m", "k", fp, nil)
	if err != nil || a.Attempts() != 1 {
		t.Fatalf("Begin after the refused Complete: %v", err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("four")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Complete(ctx, idempotency.Response{Status: 200}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("a second Complete: %v", err)
	}
	if a, err := idempotency.Begin(ctx, pool, "m", "k", []byte("other"), nil); !errors.Is(err, idempotency.ErrMismatch) || a != nil {
		t.Errorf("Begin with another fingerprint: %v, %v; want ErrMismatch and no attempt", a, err)
	}
	r, err := idempotency.Begin(ctx, pool, "m", "k", fp, &idempotency.BeginOpts{Atomic: true})
	if err != nil || r.Replay() == nil || r.Tx() != nil || r.Replay().Status != 200 || string(r.Replay().Body) != "four" {
		t.Errorf("Begin of a completed key = %+v, %v; want the replay", r, err)
	}
}

// Bad input is refused before any SQL: a pool with no server proves it.
func TestBeginRejectsBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", "")
	cases := []struct {
		scope, key string
		fp         []byte
		opts       *idempotency.BeginOpts
		want       error
	}{
		{"", "k", fp, nil, pgcoord.ErrInvalidName},
		{"s", "", fp, nil, idempotency.ErrInvalidKey},
		{"s", strings.Repeat("k", 256), fp, nil, idempotency.ErrInvalidKey},
		{"s", "new\nline", fp, nil, idempotency.ErrInvalidKey},
		{"s", "k", nil, nil, pgcoord.ErrInvalidArgument},
		{"s", "k", bytes.Repeat([]byte{1}, 65), nil, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{Retention: -time.Hour}, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{Wait: -1}, pgcoord.ErrInvalidArgument},
		// The bounds of pgcoord_idempotency_claim and _complete, refused before sending.
		{"s", "k", fp, &idempotency.BeginOpts{Retention: idempotency.MaxRetention + time.Second}, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{Wait: time.Hour + time.Second}, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{Wait: 500 * time.Microsecond}, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{MaxResponseBytes: -1}, pgcoord.ErrInvalidArgument},
		{"s", "k", fp, &idempotency.BeginOpts{MaxResponseBytes: idempotency.MaxStoredBodyBytes + 1}, pgcoord.ErrInvalidArgument},
	}
	for _, c := range cases {
		if _, err := idempotency.Begin(ctx, pool, c.scope, c.key, c.fp, c.opts); !errors.Is(err, c.want) {
			t.Errorf("Begin(%q, %q, %d bytes, %+v) = %v, want %v", c.scope, c.key, len(c.fp), c.opts, err, c.want)
		}
	}
	if _, err := idempotency.Begin(ctx, nil, "s", "k", fp, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil pool: %v", err)
	}
	for _, o := range []idempotency.GCOpts{{Batch: -1}, {Batch: idempotency.MaxGCBatch + 1}, {Tombstone: -time.Hour}, {Tombstone: idempotency.MaxRetention + time.Second}} {
		if _, err := idempotency.GC(ctx, pool, &o); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("GC %+v: %v", o, err)
		}
	}
	if _, err := idempotency.Middleware(pool, &idempotency.Config{Scope: oneScope, MaxResponseBytes: idempotency.MaxStoredBodyBytes + 1}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Middleware with MaxResponseBytes over the store's bound: %v", err)
	}
	if _, err := idempotency.Middleware(pool, &idempotency.Config{Scope: oneScope, MaxResponseBytes: idempotency.MaxStoredBodyBytes}); err != nil {
		t.Errorf("Middleware with MaxResponseBytes at the store's bound: %v", err)
	}
}

func TestDerivedKey(t *testing.T) {
	t.Parallel()
	k := idempotency.DerivedKey("payments", "order-42", "charge")
	if k != idempotency.DerivedKey("payments", "order-42", "charge") || len(k) != 64 || strings.Trim(k, "0123456789abcdef") != "" {
		t.Fatalf("DerivedKey = %q: want 64 hex characters, the same on every call", k)
	}
	// A fixed value: the derivation must never change between releases, or a retry after an
	// upgrade would send the provider a new key.
	if want := "f0aa8ec26ad9f3a9f0471a712a1cfd615378cce2bead90d151173d1b6e29482f"; k != want {
		t.Fatalf("DerivedKey = %s, want %s", k, want)
	}
	seen := map[string]bool{k: true}
	for _, other := range [][3]string{
		{"payments", "order-42", "receipt"}, {"payments", "order-43", "charge"}, {"refunds", "order-42", "charge"},
		{"payments", "order-4", "2charge"}, {"payments" + "order-42", "", "charge"},
	} {
		d := idempotency.DerivedKey(other[0], other[1], other[2])
		if seen[d] {
			t.Errorf("DerivedKey%v collides", other)
		}
		seen[d] = true
	}
}

func TestFingerprintAndParseKey(t *testing.T) {
	t.Parallel()
	h := http.Header{"Content-Type": {"application/json"}}
	base := idempotency.Fingerprint("POST", "/a", []byte("body"), h, "content-type")
	for name, other := range map[string][]byte{
		"method":        idempotency.Fingerprint("PUT", "/a", []byte("body"), h, "content-type"),
		"path":          idempotency.Fingerprint("POST", "/a?x", []byte("body"), h, "content-type"),
		"body":          idempotency.Fingerprint("POST", "/a", []byte("bodY"), h, "content-type"),
		"header value":  idempotency.Fingerprint("POST", "/a", []byte("body"), http.Header{"Content-Type": {"text/plain"}}, "content-type"),
		"header absent": idempotency.Fingerprint("POST", "/a", []byte("body"), http.Header{}, "content-type"),
		"header empty":  idempotency.Fingerprint("POST", "/a", []byte("body"), http.Header{"Content-Type": {""}}, "content-type"),
		"run together":  idempotency.Fingerprint("POST/", "a", []byte("body"), h, "content-type"),
	} {
		if bytes.Equal(base, other) {
			t.Errorf("a different %s gives the same fingerprint", name)
		}
	}
	if !bytes.Equal(base, idempotency.Fingerprint("POST", "/a", []byte("body"), h, "Content-Type")) || len(base) != 32 {
		t.Error("the fingerprint is not stable")
	}
	for in, want := range map[string]string{`abc`: "abc", `"abc"`: "abc", `"a\"b\\c"`: `a"b\c`, ` k `: "k"} {
		if got, err := idempotency.ParseKey(in); err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", `""`, "\x00", "é", strings.Repeat("a", 256)} {
		if _, err := idempotency.ParseKey(bad); !errors.Is(err, idempotency.ErrInvalidKey) || !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("ParseKey(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}

// A waiting Begin gets the key when the holder rolls back (and executes), and ErrInFlight
// when its wait passes first.
func TestBeginWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	a, err := idempotency.Begin(ctx, pool, "w", "k", fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Begin(ctx, pool, "w", "k", fp, &idempotency.BeginOpts{Wait: 50 * time.Millisecond}); !errors.Is(err, idempotency.ErrInFlight) {
		t.Fatalf("Begin waiting 50ms on a held key: %v, want ErrInFlight", err)
	}
	waiting := pgtest.Go(func() (*idempotency.Attempt, error) {
		return idempotency.Begin(ctx, pool, "w", "k", fp, &idempotency.BeginOpts{Wait: pgtest.WaitLimit})
	})
	a.Close(ctx) // the first attempt fails: the waiter executes
	b, err := waiting.Wait(t)
	if err != nil || b.Replay() != nil || b.Attempts() != 1 {
		t.Fatalf("waiting Begin after the holder rolled back = %v, %v; want to hold the key", b, err)
	}
	b.Close(ctx)
}

// The attempt's Tx is a real pgx transaction: savepoints work, and only the writes that
// stand when Complete commits are kept. Later Atomic attempts on the same connection (whose
// BEGIN rides with the claim) get the same: their own transaction, not the previous one's.
func TestAtomicTxSavepoints(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := pgtest.Pool(t).Config()
	cfg.MaxConns = 2 // the least an Atomic attempt accepts
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	exec(t, pool, `CREATE TABLE notes (attempt int, note text)`)
	for i, complete := range []bool{true, false, true} {
		a, err := idempotency.Begin(ctx, pool, "tx", fmt.Sprint("k", i), fp, &idempotency.BeginOpts{Atomic: true})
		if err != nil {
			t.Fatal(err)
		}
		tx := a.Tx()
		nested, err := tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, nested, `INSERT INTO notes VALUES ($1, 'undone')`, i)
		if err := nested.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		exec(t, tx, `INSERT INTO notes VALUES ($1, 'kept')`, i)
		if err := tx.Rollback(ctx); err == nil {
			t.Fatal("the attempt's Tx rolled back on the handler's say")
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("the attempt's Tx committed on the handler's say")
		}
		if !complete {
			a.Close(ctx)
		} else if err := a.Complete(ctx, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
		if a.Tx() != nil {
			t.Errorf("attempt %d: Tx after it ended is not nil", i)
		}
		var notes []string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(attempt || ':' || note ORDER BY attempt), '{}') FROM notes`).Scan(&notes); err != nil {
			t.Fatal(err)
		}
		want := []string{"0:kept"}
		if i == 2 {
			want = append(want, "2:kept")
		}
		if !slices.Equal(notes, want) {
			t.Fatalf("after attempt %d (completed: %v) the notes are %q, want %q", i, complete, notes, want)
		}
	}
}
