package semaphore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// replyDropper (as in the leases tests) cuts a connection right after the server has answered (and so committed) a
// statement containing marker, before the client reads the answer: the "acquire
// succeeded but the reply was lost" fault, made deterministic.
type replyDropper struct {
	marker  []byte
	armed   atomic.Bool
	dropped atomic.Int32
}

func (d *replyDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

type droppingConn struct {
	net.Conn
	d       *replyDropper
	mu      sync.Mutex
	tripped bool
	pending bytes.Buffer // server bytes read ahead and not yet given to the client
}

func (c *droppingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.d.armed.Load() && bytes.Contains(b, c.d.marker) {
		c.tripped = true
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *droppingConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending.Len() > 0 {
		return c.pending.Read(b)
	}
	if !c.tripped {
		return c.Conn.Read(b)
	}
	// Read the whole answer, up to ReadyForQuery. If it completed a command (the statement
	// ran and its transaction committed), cut the connection instead of delivering it;
	// otherwise (the statement was only being prepared) pass it on.
	c.tripped = false
	completed := false
	for {
		var header [5]byte
		if _, err := io.ReadFull(c.Conn, header[:]); err != nil {
			return 0, err
		}
		body := make([]byte, binary.BigEndian.Uint32(header[1:])-4)
		if _, err := io.ReadFull(c.Conn, body); err != nil {
			return 0, err
		}
		c.pending.Write(header[:])
		c.pending.Write(body)
		if header[0] == 'C' {
			completed = true
		}
		if header[0] == 'Z' {
			break
		}
	}
	if !completed {
		c.tripped = true // the execution is still to come
		return c.pending.Read(b)
	}
	c.pending.Reset()
	c.d.armed.Store(false)
	c.d.dropped.Add(1)
	c.Conn.Close()
	return 0, errors.New("test: reply dropped after the server committed")
}

// dropPool returns a pool on a fresh migrated schema whose connections drop the reply of
// the first statement containing marker once armed.
func dropPool(t *testing.T, marker string) (*pgxpool.Pool, *replyDropper) {
	t.Helper()
	_, schema := pgtest.Schema(t)
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{AppName: "pgcoord-test-lostreply", Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	dropper := &replyDropper{marker: []byte(marker)}
	cfg.ConnConfig.DialFunc = dropper.dial
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pgcoord.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	return pool, dropper
}

// The admission commits, its reply is lost with the connection, and TryAcquire still
// returns the permit — by asking again as the same holder — instead of ErrFull from a key
// whose only slot its own lost permit holds.
func TestTryAcquireRecoversAPermitWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := dropPool(t, "pgcoord_semaphore_acquire")
	dropper.armed.Store(true)
	p, err := semaphore.TryAcquire(ctx, pool, "tenant", 1, time.Minute, nil)
	if dropper.dropped.Load() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.dropped.Load())
	}
	if err != nil {
		t.Fatalf("TryAcquire after a lost reply: %v", err)
	}
	infos, err := semaphore.Permits(ctx, pool, "tenant")
	if err != nil || len(infos) != 1 || infos[0].Holder != p.Holder || infos[0].Token != p.Token || p.Token != 1 {
		t.Fatalf("recovered permit %+v, permits %+v (%v)", p, infos, err)
	}
}

// The same for a waiting Acquire: its connection dies with the reply of the admitting
// attempt, and it asks once more on another connection.
func TestAcquireRecoversAPermitWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	pool, dropper := dropPool(t, "pgcoord_semaphore_acquire")
	dropper.armed.Store(true)
	p, err := semaphore.Acquire(ctx, pool, "tenant", 1, time.Minute, nil)
	if dropper.dropped.Load() != 1 {
		t.Fatalf("the fault was not injected (dropped %d replies): the test proves nothing", dropper.dropped.Load())
	}
	if err != nil {
		t.Fatalf("Acquire after a lost reply: %v", err)
	}
	if s := mustGet(t, pool, "tenant"); s.Held != 1 || s.Token != p.Token || s.Waiters != 0 {
		t.Fatalf("recovered permit %+v, status %+v", p, s)
	}
}
