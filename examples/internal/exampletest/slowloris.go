package exampletest

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Slowloris connects to addr and sends a request's headers a byte at a time, never ending
// them, until the server closes the connection; it fails t if the server still holds it
// after pgtest.WaitLimit. It returns how many header bytes it sent.
func Slowloris(t testing.TB, addr string) int {
	t.Helper()
	var conn net.Conn
	WaitFor(t, "the server to listen", func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", addr)
		conn = c
		return err == nil, nil
	})
	defer conn.Close()
	closed := make(chan struct{})
	go func() { // whatever the server answers, then the end of the connection
		_, _ = bufio.NewReader(conn).ReadString(0)
		close(closed)
	}()
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")); err != nil {
		t.Fatal(err)
	}
	start, sent := time.Now(), 0
	for {
		select {
		case <-closed:
			return sent
		default:
		}
		if time.Since(start) > pgtest.WaitLimit {
			t.Fatalf("exampletest: a client sending a header byte by byte for %v (%d bytes) is still connected", pgtest.WaitLimit, sent)
		}
		if _, err := conn.Write([]byte("a")); err == nil {
			sent++
		}
		time.Sleep(20 * time.Millisecond) // the client's pace, not an assertion
	}
}
