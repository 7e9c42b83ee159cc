package singleton_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// One replica runs at a time, with no transaction open while fn runs (VACUUM is not held
// back), and RunOnce of the same job is excluded too (one key).
func TestRunSessionExcludesAndHoldsNoTransaction(t *testing.T) {
	t.Parallel()
	pool, _ := migrated(t, 6)
	ctx := t.Context()
	ran, err := singleton.RunSession(ctx, pool, "vacuum-friendly", func(ctx context.Context) error {
		pid := lockHolder(ctx, t, pool, "vacuum-friendly")
		if pid == 0 {
			return errors.New("nobody holds the lock while fn runs")
		}
		// The lock's backend is idle, outside any transaction, holding no snapshot.
		eventually(t, 5*time.Second, func() error {
			var state string
			var xactStart, xid, xmin *string
			err := pool.QueryRow(ctx, `SELECT state, xact_start::text, backend_xid::text, backend_xmin::text
				FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state, &xactStart, &xid, &xmin)
			if err != nil {
				return err
			}
			if state != "idle" || xactStart != nil || xid != nil || xmin != nil {
				return fmt.Errorf("the lock's backend is %q, xact_start %v, backend_xid %v, backend_xmin %v; want idle with none",
					state, deref(xactStart), deref(xid), deref(xmin))
			}
			return nil
		})
		if ran, err := singleton.RunSession(ctx, pool, "vacuum-friendly", func(context.Context) error { return nil }, nil); ran || err != nil {
			return fmt.Errorf("a second RunSession = (%v, %v), want (false, nil)", ran, err)
		}
		if ran, err := singleton.RunOnce(ctx, pool, "vacuum-friendly", func(context.Context, pgx.Tx) error { return nil }); ran || err != nil {
			return fmt.Errorf("RunOnce of the same job = (%v, %v), want (false, nil)", ran, err)
		}
		return nil
	}, nil)
	if !ran || err != nil {
		t.Fatalf("RunSession = (%v, %v)", ran, err)
	}
	if pid := lockHolder(ctx, t, pool, "vacuum-friendly"); pid != 0 {
		t.Fatalf("backend %d holds the lock after RunSession returned", pid)
	}
	if ran, err := singleton.RunSession(ctx, pool, "vacuum-friendly", func(context.Context) error { return nil }, nil); !ran || err != nil {
		t.Fatalf("RunSession after the first = (%v, %v), want it to run", ran, err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// fn's error is returned and the lock released; a panicking fn leaves no lock behind either
// (its connection is closed).
func TestRunSessionReleasesAfterFailure(t *testing.T) {
	pgtest.NeedsSession(t, "a session-level advisory lock; behind a pooler RunSession returns ErrPooler (pooler_test.go)")
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	boom := errors.New("boom")
	if ran, err := singleton.RunSession(ctx, pool, "job", func(context.Context) error { return boom }, nil); !ran || !errors.Is(err, boom) {
		t.Fatalf("RunSession = (%v, %v), want (true, boom)", ran, err)
	}
	if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
		t.Fatalf("backend %d holds the lock after fn failed", pid)
	}
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_, _ = singleton.RunSession(ctx, pool, "job", func(context.Context) error { panic("kaboom") }, nil)
	}()
	eventually(t, 10*time.Second, func() error {
		if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
			return fmt.Errorf("backend %d holds the lock after fn panicked", pid)
		}
		return nil
	})
}

// When the lock's connection dies, the watchdog cancels fn's context with ErrLockLost and
// the lock is free for another replica.
func TestRunSessionCancelsFnWhenItsConnectionDies(t *testing.T) {
	t.Parallel()
	pool, _ := migrated(t, 6)
	ctx := t.Context()
	started := make(chan struct{})
	var cause error
	result := make(chan outcome, 1)
	go func() {
		ran, err := singleton.RunSession(ctx, pool, "long", func(fnCtx context.Context) error {
			close(started)
			select {
			case <-fnCtx.Done():
				cause = context.Cause(fnCtx)
				return fnCtx.Err()
			case <-time.After(30 * time.Second):
				return errors.New("fn was never told the lock was lost")
			}
		}, &singleton.SessionOpts{CheckEvery: 20 * time.Millisecond})
		result <- outcome{ran, err}
	}()
	within(t, 10*time.Second, started, "fn starting")
	pid := lockHolder(ctx, t, pool, "long")
	if pid == 0 {
		t.Fatal("nobody holds the lock while fn runs")
	}
	terminate(ctx, t, pool, pid)
	r := within(t, 15*time.Second, result, "RunSession returning after its connection died")
	if !r.ran || !errors.Is(r.err, singleton.ErrLockLost) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("RunSession = (%v, %v), want (true, ErrLockLost joined with fn's context.Canceled)", r.ran, r.err)
	}
	if !errors.Is(cause, singleton.ErrLockLost) {
		t.Fatalf("fn's context cause = %v, want ErrLockLost", cause)
	}
	eventually(t, 10*time.Second, func() error {
		ran, err := singleton.RunSession(ctx, pool, "long", func(context.Context) error { return nil }, nil)
		if !ran || err != nil {
			return fmt.Errorf("RunSession after the holder's connection died = (%v, %v), want it to run", ran, err)
		}
		return nil
	})
}

// Behind a pooler the backend pid the server reports differs from the one the connection
// received at startup (BackendKeyData). A proxy that rewrites that pid, as PgBouncer's
// own cancel key does, makes RunSession refuse with ErrPooler — leaving no lock behind —
// unless AllowPooler is set; the same proxy without the rewrite (and a direct connection)
// is accepted, so the pid comparison is what detects it. RunOnce works through it.
func TestRunSessionRefusesBehindAPooler(t *testing.T) {
	t.Parallel()
	pool, schema := migrated(t, 4)
	ctx := t.Context()
	pooler := proxyPool(t, schema, true)
	called := false
	fn := func(context.Context) error { called = true; return nil }

	ran, err := singleton.RunSession(ctx, pooler, "job", fn, nil)
	if ran || called || !errors.Is(err, pgcoord.ErrPooler) || !strings.Contains(err.Error(), "use RunOnce") {
		t.Fatalf("RunSession behind a pooler = (%v, %v), fn called %v; want (false, ErrPooler)", ran, err, called)
	}
	if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
		t.Fatalf("backend %d holds the lock after ErrPooler", pid)
	}
	if ran, err := singleton.RunOnce(ctx, pooler, "job", func(context.Context, pgx.Tx) error { return nil }); !ran || err != nil {
		t.Fatalf("RunOnce behind the pooler = (%v, %v), want it to run", ran, err)
	}
	if ran, err := singleton.RunSession(ctx, pooler, "job", fn, &singleton.SessionOpts{AllowPooler: true}); !ran || err != nil || !called {
		t.Fatalf("RunSession with AllowPooler = (%v, %v), fn called %v; want it to run", ran, err, called)
	}
	for name, p := range map[string]*pgxpool.Pool{"plain proxy": proxyPool(t, schema, false), "direct": pool} {
		called = false
		if ran, err := singleton.RunSession(ctx, p, "job", fn, nil); !ran || err != nil || !called {
			t.Fatalf("%s: RunSession = (%v, %v), fn called %v; want it to run", name, ran, err, called)
		}
	}
	if pid := lockHolder(ctx, t, pool, "job"); pid != 0 {
		t.Fatalf("backend %d holds the lock at the end", pid)
	}
}

func TestRunSessionValidatesFirst(t *testing.T) {
	t.Parallel()
	fn := func(context.Context) error { return nil }
	if _, err := singleton.RunSession(t.Context(), nil, "bad\x00name", fn, nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("bad job: %v, want ErrInvalidName", err)
	}
	if _, err := singleton.RunSession(t.Context(), nil, "job", fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil pool: %v, want ErrInvalidArgument", err)
	}
	pool := pgtest.Pool(t)
	if _, err := singleton.RunSession(t.Context(), pool, "job", nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil fn: %v, want ErrInvalidArgument", err)
	}
	if _, err := singleton.RunSession(t.Context(), pool, "job", fn, &singleton.SessionOpts{CheckEvery: -time.Second}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("negative CheckEvery: %v, want ErrInvalidArgument", err)
	}
}

// proxyPool returns a pool on schema whose connections go through a TCP proxy to the test
// server; with rewritePID the proxy changes the process id of the BackendKeyData message,
// as a pooler's own cancel key would.
func proxyPool(t *testing.T, schema string, rewritePID bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{AppName: "pgcoord-test-proxied", Schema: schema, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port))
	addr := startProxy(t, target, rewritePID)
	host, port, _ := net.SplitHostPort(addr)
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.TLSConfig = nil // the proxy parses the server's messages: plain text only
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// startProxy forwards TCP connections to target until t ends, and returns its address.
func startProxy(t *testing.T, target string, rewritePID bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			track(client)
			track(server)
			wg.Go(func() {
				_, _ = io.Copy(server, client)
				server.Close()
			})
			wg.Go(func() {
				_ = copyMessages(client, server, rewritePID)
				client.Close()
			})
		}
	})
	return ln.Addr().String()
}

// copyMessages copies the server's protocol messages (type byte, int32 length, body) to
// the client, changing the process id in BackendKeyData ('K') if rewritePID.
func copyMessages(dst io.Writer, src io.Reader, rewritePID bool) error {
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(src, header); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(header[1:])) - 4
		if n < 0 {
			return fmt.Errorf("bad message length %d", n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			return err
		}
		if header[0] == 'K' && rewritePID && n >= 4 {
			pid := binary.BigEndian.Uint32(body)
			binary.BigEndian.PutUint32(body, pid^0x2a2a2a)
		}
		if _, err := dst.Write(append(header, body...)); err != nil {
			return err
		}
	}
}
