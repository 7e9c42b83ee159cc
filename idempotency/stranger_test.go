package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// stranger connects as a new role with LOGIN and nothing else (no grant on any pgcoord
// table or schema), dropped when t ends: any login of the shared database.
func stranger(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Direct(t, pool)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	role, password := "pgcoord_stranger_"+hex.EncodeToString(b), hex.EncodeToString(b)+"x"
	exec(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, password))
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		if _, err := admin.Exec(ctx, `DROP ROLE `+role); err != nil {
			t.Errorf("drop the stranger role: %v", err)
		}
	})
	cfg := admin.Config().ConnConfig.Copy()
	cfg.User, cfg.Password = role, password
	delete(cfg.RuntimeParams, "search_path")
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect as the stranger: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	return conn
}

// A login with no grant squats the advisory-lock keys an attempt would use — computed as
// 00005_idempotency.sql computes them, and read from pg_locks while attempts hold them —
// and tries to lock the key rows. It cannot stall a key: a first attempt and the retry of
// a failed one both execute.
func TestStrangerCannotStallAKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	s := stranger(t, pool)
	// The key of (scope, key) as the migration derives it: pgcoord_lock_key, whose body
	// carries the schema, of 'idempotency:' || octet_length(scope) || ':' || scope || key.
	squat := func(scope, key string) {
		t.Helper()
		name := fmt.Sprintf("%s.idempotency:%d:%s%s", schema, len(scope), scope, key)
		if _, err := s.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, name); err != nil {
			t.Fatalf("the stranger could not squat %s/%s: %v", scope, key, err)
		}
	}
	// Keys read from pg_locks: every advisory lock another session holds.
	readHeld := func() []int64 {
		t.Helper()
		rows, _ := s.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid <> pg_backend_pid()`)
		held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatalf("the stranger reads pg_locks: %v", err)
		}
		return held
	}
	for _, atomic := range []bool{false, true} {
		opts := &idempotency.BeginOpts{Atomic: atomic}
		mode := fmt.Sprintf("atomic=%v", atomic)
		// Squatted before first use, from the migration's formula.
		squat("pay", mode+"-computed")
		a, err := idempotency.Begin(ctx, pool, "pay", mode+"-computed", fp, opts)
		if err != nil || a.Replay() != nil {
			t.Errorf("%s: first attempt of a squatted key = %v; want it executed", mode, err)
		} else if err := a.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		// Read from pg_locks while an attempt holds the key, squatted once it failed.
		key := mode + "-read"
		a, err = idempotency.Begin(ctx, pool, "pay", key, fp, opts)
		if err != nil || a.Replay() != nil {
			t.Fatalf("%s: first attempt = %v", mode, err)
		}
		held := readHeld()
		a.Close(ctx) // the attempt fails: its retry must execute
		for _, k := range held {
			if _, err := s.Exec(ctx, `SELECT pg_try_advisory_lock($1)`, k); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: the stranger read %d advisory keys from pg_locks and holds them", mode, len(held))
		b, err := idempotency.Begin(ctx, pool, "pay", key, fp, opts)
		if err != nil || b.Replay() != nil {
			t.Fatalf("%s: retry of a failed attempt while a stranger squats = %v; want it executed", mode, err)
		}
		if err := b.Complete(ctx, idempotency.Response{Status: 201, Body: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		// Nor can it lock or change the key rows.
		_, err = s.Exec(ctx, fmt.Sprintf(`SELECT FROM %s.pgcoord_idempotency_keys FOR UPDATE`, pgx.Identifier{schema}.Sanitize()))
		if err == nil {
			t.Fatalf("%s: the stranger locked the key rows", mode)
		}
		if _, err := s.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Fatal(err)
		}
	}
}

// The functions of 00011 resolve names in pgcoord's schema, then pg_temp, whatever the
// caller's search_path: a login cannot shadow a table or function they use with one of
// its own.
func TestLivenessFunctionsPinTheirSearchPath(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var schema string
	if err := pool.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(t.Context(), `SELECT ARRAY[p.proname::text, coalesce(array_to_string(p.proconfig, ','), '')]
		FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
		  AND p.proname IN ('pgcoord_idempotency_claim', 'pgcoord_idempotency_renew', 'pgcoord_idempotency_release',
		                    'pgcoord_idempotency_lookup', 'pgcoord_idempotency_held', 'pgcoord_idempotency_gc')`)
	configs, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		t.Fatal(err)
	}
	if len(configs) != 6 {
		t.Fatalf("found %d of the 6 functions", len(configs))
	}
	want := "search_path=" + pgx.Identifier{schema}.Sanitize() + ", pg_temp"
	for _, c := range configs {
		if c[1] != want && c[1] != "search_path="+schema+", pg_temp" {
			t.Errorf("%s: config %q, want %q", c[0], c[1], want)
		}
	}
}
