package gocronpg_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

func TestMain(m *testing.M) {
	// A worker process of TestLockerAcrossProcesses runs its scheduler and exits here,
	// without the testing package.
	workerproc.Main(map[string]workerproc.Role{processRole: processReplica})
	pgtest.Main(m)
}

// testLogger logs to t (shown with -v or when t fails).
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// waitFor polls cond every few milliseconds until it holds, or fails t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alignedStart returns the first multiple of every (since the Unix epoch) at least lead
// from now: a start time at which every replica's DurationJob fires in step.
func alignedStart(every, lead time.Duration) time.Time {
	at := time.Now().Add(lead).UnixMicro()
	e := every.Microseconds()
	return time.UnixMicro((at/e + 1) * e)
}

// tickOf returns the index of the tick of a job started at start with interval every that
// a run at time at serves: the nearest one. For a Locker's run, pass its slot
// (Run.ScheduledFor), which starts half an interval before its tick.
func tickOf(at, start time.Time, every time.Duration) int64 {
	return int64((at.Sub(start) + every/2) / every)
}
