package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// ReplyDropper injects the "the statement committed but its reply was lost" fault,
// deterministically: once armed, it cuts the connection right after the server has answered
// — and so committed — the first statement whose text contains its marker, before the
// client reads the answer. Statements that are only prepared pass through.
type ReplyDropper struct {
	marker  []byte
	armed   atomic.Bool
	dropped atomic.Int32
}

// Arm makes the dropper cut the next executed statement containing its marker.
func (d *ReplyDropper) Arm() { d.armed.Store(true) }

// Dropped reports how many replies were dropped: a test that expected the fault checks it
// is 1, or it proves nothing.
func (d *ReplyDropper) Dropped() int { return int(d.dropped.Load()) }

// DropPool returns a pool on a fresh migrated schema for t whose connections drop the
// reply of the first statement containing marker once the returned dropper is armed.
func DropPool(t testing.TB, marker string) (*pgxpool.Pool, *ReplyDropper) {
	t.Helper()
	_, schema := Schema(t)
	cfg, err := pgconfig.Pool(URL(t), pgconfig.Options{AppName: "pgcoord-test-lostreply", Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	d := &ReplyDropper{marker: []byte(marker)}
	cfg.ConnConfig.DialFunc = d.dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pgcoord.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatal(err)
	}
	return pool, d
}

func (d *ReplyDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

// droppingConn is one connection of a DropPool. Write and Read share only the atomic
// tripped flag: a Read blocked on the server (pgx's background reader on an idle
// connection) must never keep a Write — the Terminate message of a Close — waiting.
// Reads come from one goroutine at a time, so pending needs no lock.
type droppingConn struct {
	net.Conn
	d       *ReplyDropper
	tripped atomic.Bool
	pending bytes.Buffer // server bytes read ahead and not yet given to the client
}

func (c *droppingConn) Write(b []byte) (int, error) {
	if c.d.armed.Load() && bytes.Contains(b, c.d.marker) {
		c.tripped.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *droppingConn) Read(b []byte) (int, error) {
	if c.pending.Len() > 0 {
		return c.pending.Read(b)
	}
	if !c.tripped.Swap(false) {
		return c.Conn.Read(b)
	}
	// Read the whole answer, up to ReadyForQuery. If it completed a command (the statement
	// ran and its transaction committed), cut the connection instead of delivering it;
	// otherwise (the statement was only being prepared) pass it on.
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
		c.tripped.Store(true) // the execution is still to come
		return c.pending.Read(b)
	}
	c.pending.Reset()
	c.d.armed.Store(false)
	c.d.dropped.Add(1)
	c.Conn.Close()
	return 0, errors.New("pgtest: reply dropped after the server committed")
}
