package leases_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/leases"
)

// electorTerm is one term of leadership as the leader's callbacks saw it.
type electorTerm struct {
	holder     string
	token      int64
	start, end time.Time // local clock: OnStartedLeading entered; its context ended or it quit
	cause      error     // context.Cause of the term's context when it ended (nil if it quit)
}

// electorCandidate is one Elector of a test, run in a goroutine, with everything its
// callbacks saw.
type electorCandidate struct {
	*leases.Elector
	t    *testing.T
	quit chan struct{} // a value makes the current OnStartedLeading return early

	mu       sync.Mutex
	terms    []electorTerm
	leaders  []string // OnNewLeader calls
	stopped  int      // OnStoppedLeading calls
	cancel   context.CancelFunc
	runErr   chan error
	inFlight bool
}

// newElectorCandidate creates an Elector on pool for name, with cfg's settings and the
// candidate's recording callbacks, and starts it.
func newElectorCandidate(t *testing.T, pool *pgxpool.Pool, cfg leases.ElectorConfig) *electorCandidate {
	t.Helper()
	c := &electorCandidate{t: t, quit: make(chan struct{}, 1)}
	cfg.OnStartedLeading = func(ctx context.Context, l leases.Lease) {
		i := c.startTerm(l)
		select {
		case <-ctx.Done():
			c.endTerm(i, context.Cause(ctx))
		case <-c.quit:
			c.endTerm(i, nil)
		}
	}
	cfg.OnStoppedLeading = func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.stopped++
	}
	cfg.OnNewLeader = func(holder string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.leaders = append(c.leaders, holder)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = &leases.Metrics{}
	}
	cfg.Logger = testLogger(t)
	e, err := leases.NewElector(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Elector = e
	c.start()
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *electorCandidate) startTerm(l leases.Lease) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.Holder != c.Holder() {
		c.t.Errorf("%s leads with a grant held by %s", c.Holder(), l.Holder)
	}
	c.terms = append(c.terms, electorTerm{holder: l.Holder, token: l.Token, start: time.Now()})
	return len(c.terms) - 1
}

func (c *electorCandidate) endTerm(i int, cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.terms[i].end, c.terms[i].cause = time.Now(), cause
}

// start runs the Elector in a goroutine.
func (c *electorCandidate) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel, c.runErr, c.inFlight = cancel, make(chan error, 1), true
	go func() { c.runErr <- c.Run(runCtx) }()
}

// stop cancels Run and waits for it to return, bounded.
func (c *electorCandidate) stop() {
	c.mu.Lock()
	if !c.inFlight {
		c.mu.Unlock()
		return
	}
	c.inFlight = false
	cancel, runErr := c.cancel, c.runErr
	c.mu.Unlock()
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			c.t.Errorf("%s: Run returned %v after its context ended, want nil", c.Holder(), err)
		}
	case <-time.After(15 * time.Second):
		c.t.Errorf("%s: Run did not return within 15s of its context ending", c.Holder())
	}
}

func (c *electorCandidate) snapshot() (terms []electorTerm, leaders []string, stopped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.terms), slices.Clone(c.leaders), c.stopped
}

// testLogger logs to t (shown with -v or when t fails).
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// electorWait polls cond every millisecond until it holds, or fails t after d.
func electorWait(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// leaderOf returns the candidate that reports IsLeader, or nil.
func leaderOf(cs []*electorCandidate) *electorCandidate {
	for _, c := range cs {
		if c.IsLeader() {
			return c
		}
	}
	return nil
}

// leaderSampler checks, as fast as it can until stopped, that no two candidates report
// IsLeader at once. A sweep over all candidates counts as a snapshot only if it took less
// than snapshotMax: a handoff (fn returns, release, notification, acquire) takes two
// database round trips, far more, so two leaders in one snapshot are two leaders at once.
type leaderSampler struct {
	stop      chan struct{}
	done      chan struct{}
	snapshots int
	withOne   int
	conflicts []string
}

const snapshotMax = 200 * time.Microsecond

func sampleLeaders(cs []*electorCandidate) *leaderSampler {
	s := &leaderSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			begin := time.Now()
			var leaders []string
			for _, c := range cs {
				if c.IsLeader() {
					leaders = append(leaders, c.Holder())
				}
			}
			if time.Since(begin) > snapshotMax {
				continue
			}
			s.snapshots++
			if len(leaders) == 1 {
				s.withOne++
			}
			if len(leaders) > 1 && len(s.conflicts) < 10 {
				s.conflicts = append(s.conflicts, fmt.Sprint(leaders))
			}
			time.Sleep(100 * time.Microsecond) // leave the CPUs to the candidates
		}
	}()
	return s
}

func (s *leaderSampler) finish() {
	close(s.stop)
	<-s.done
}

// checkTerms asserts that the terms of all candidates, ordered by token, have strictly
// increasing tokens and do not overlap in time: each term started after the previous one
// ended.
func checkTerms(t *testing.T, cs []*electorCandidate) []electorTerm {
	t.Helper()
	var all []electorTerm
	for _, c := range cs {
		terms, _, _ := c.snapshot()
		all = append(all, terms...)
	}
	slices.SortFunc(all, func(a, b electorTerm) int { return int(a.token - b.token) })
	for i, term := range all {
		if term.end.IsZero() && i != len(all)-1 {
			t.Errorf("term %d (token %d, %s) never ended but a later term exists", i, term.token, term.holder)
		}
		if i == 0 {
			continue
		}
		prev := all[i-1]
		if term.token <= prev.token {
			t.Errorf("tokens do not strictly increase: %d after %d", term.token, prev.token)
		}
		if !term.start.After(prev.end) {
			t.Errorf("term with token %d (%s) started %v before the term with token %d (%s) ended",
				term.token, term.holder, prev.end.Sub(term.start), prev.token, prev.holder)
		}
	}
	return all
}
