package leases_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
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

// Several candidates, leadership moving between them by resignation (Run cancelled) and
// by the leader's function returning: never two leaders at once, by IsLeader and by the
// terms the callbacks recorded, ordered by token.
func TestElectorOneLeaderAtATime(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var cs []*electorCandidate
	for range 4 {
		cs = append(cs, newElectorCandidate(t, pool, leases.ElectorConfig{
			Name: "singleton", TTL: 2 * time.Second, PollInterval: 50 * time.Millisecond, Cooldown: 20 * time.Millisecond,
		}))
	}
	s := sampleLeaders(cs)
	const rounds = 10
	var lastToken int64
	for round := range rounds {
		var leader *electorCandidate
		var l leases.Lease
		electorWait(t, 10*time.Second, fmt.Sprintf("round %d: a new leader", round), func() bool {
			leader = leaderOf(cs)
			if leader == nil {
				return false
			}
			l, _ = leader.Leader()
			return l.Token > lastToken
		})
		lastToken = l.Token
		time.Sleep(100 * time.Millisecond) // let the sampler watch this term
		if round%2 == 0 {
			leader.stop() // resign on shutdown
			leader.start()
		} else {
			select { // the leader's function returns: resign, campaign again
			case leader.quit <- struct{}{}:
			default:
			}
		}
	}
	electorWait(t, 10*time.Second, "a last leader", func() bool {
		leader := leaderOf(cs)
		if leader == nil {
			return false
		}
		l, _ := leader.Leader()
		return l.Token > lastToken
	})
	s.finish()
	for _, c := range cs {
		c.stop()
	}
	if len(s.conflicts) > 0 {
		t.Errorf("%d-candidate snapshots with two leaders: %v", len(cs), s.conflicts)
	}
	if s.snapshots < 500 || s.withOne == 0 {
		t.Errorf("the sampler took %d snapshots, %d with a leader: too few to mean anything", s.snapshots, s.withOne)
	}
	all := checkTerms(t, cs)
	if len(all) < rounds+1 {
		t.Errorf("%d terms for %d handoffs", len(all), rounds)
	}
	for _, c := range cs {
		terms, _, stopped := c.snapshot()
		if stopped != len(terms) {
			t.Errorf("%s: %d terms but OnStoppedLeading called %d times", c.Holder(), len(terms), stopped)
		}
	}
	t.Logf("%d terms; %d snapshots, %d with exactly one leader", len(all), s.snapshots, s.withOne)
}

// A leader that shuts down resigns: its release wakes a waiting candidate at once. The poll
// interval (5s) and the TTL (10s) are long, so only the notification explains a handoff
// well under a second.
func TestElectorFailoverOnResignIsPrompt(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN: a handoff faster than the poll interval is the notification's; behind a pooler candidates poll")
	t.Parallel()
	pool := pgtest.Pool(t)
	var cs []*electorCandidate
	for range 4 {
		cs = append(cs, newElectorCandidate(t, pool, leases.ElectorConfig{
			Name: "relay", TTL: 10 * time.Second, PollInterval: 5 * time.Second,
		}))
	}
	var handoffs []time.Duration
	for round := range 3 {
		var leader *electorCandidate
		electorWait(t, 10*time.Second, "a leader", func() bool {
			leader = leaderOf(cs)
			return leader != nil
		})
		old, _ := leader.Leader()
		begin := time.Now()
		leader.stop()
		if leader.IsLeader() {
			t.Fatal("a resigned candidate still reports IsLeader")
		}
		var next *electorCandidate
		took := electorWait(t, 4*time.Second, fmt.Sprintf("round %d: a new leader after the leader resigned", round), func() bool {
			next = leaderOf(cs)
			return next != nil
		})
		handoffs = append(handoffs, time.Since(begin))
		if next == leader {
			t.Fatal("the resigned candidate leads again")
		}
		l, _ := next.Leader()
		if l.Token <= old.Token {
			t.Errorf("new leader's token %d after %d", l.Token, old.Token)
		}
		if _, _, stopped := leader.snapshot(); stopped == 0 {
			t.Errorf("OnStoppedLeading was not called on the resigned leader")
		}
		if took > time.Second {
			t.Errorf("handoff took %v with a 10s TTL and a 5s poll: the release did not wake the candidates", took)
		}
	}
	checkTerms(t, cs)
	t.Logf("handoffs after resignation (cancel → new leader): %v", handoffs)
}

// An operator's forced expiry deposes the leader: its function's context is cancelled
// with ErrLost, IsLeader turns false, another candidate is elected with a higher token,
// and every candidate observes the new leader through OnNewLeader.
func TestElectorLosesLeadershipOnExpire(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var cs []*electorCandidate
	for range 3 {
		cs = append(cs, newElectorCandidate(t, pool, leases.ElectorConfig{
			Name: "scheduler", TTL: 1500 * time.Millisecond, PollInterval: 100 * time.Millisecond,
			Cooldown: 3 * time.Second, // the deposed leader stays out while the others take over
		}))
	}
	var old *electorCandidate
	electorWait(t, 10*time.Second, "a leader", func() bool {
		old = leaderOf(cs)
		return old != nil
	})
	oldLease, _ := old.Leader()
	// Every candidate has seen the first leader before it is deposed.
	for _, c := range cs {
		electorWait(t, 5*time.Second, "followers observe the leader", func() bool { return c.ObservedLeader() == old.Holder() })
	}

	expired := time.Now()
	if _, err := leases.Expire(ctx, pool, "scheduler", "test"); err != nil {
		t.Fatal(err)
	}
	electorWait(t, 5*time.Second, "the deposed leader stops reporting IsLeader", func() bool { return !old.IsLeader() })
	deposed := time.Since(expired)
	var next *electorCandidate
	electorWait(t, 5*time.Second, "a new leader", func() bool {
		next = leaderOf(cs)
		return next != nil
	})
	elected := time.Since(expired)
	if next == old {
		t.Fatal("the deposed leader was elected again within its cooldown")
	}
	newLease, _ := next.Leader()
	if newLease.Token <= oldLease.Token {
		t.Fatalf("new leader's token %d is not above the deposed one's %d", newLease.Token, oldLease.Token)
	}
	electorWait(t, 5*time.Second, "the deposed leader's function returns", func() bool {
		terms, _, _ := old.snapshot()
		return !terms[len(terms)-1].end.IsZero()
	})
	terms, _, _ := old.snapshot()
	if cause := terms[len(terms)-1].cause; !errors.Is(cause, leases.ErrLost) {
		t.Errorf("the deposed leader's context ended with %v, want ErrLost", cause)
	}
	for _, c := range cs {
		electorWait(t, 5*time.Second, "every candidate observes the new leader", func() bool {
			_, leaders, _ := c.snapshot()
			return len(leaders) > 0 && leaders[len(leaders)-1] == next.Holder()
		})
		_, leaders, _ := c.snapshot()
		if want := []string{old.Holder(), next.Holder()}; !slices.Equal(leaders, want) {
			t.Errorf("%s observed leaders %v, want %v", c.Holder(), leaders, want)
		}
	}
	t.Logf("after Expire: the deposed leader stopped reporting IsLeader after %v, a new leader was elected after %v", deposed, elected)
}

// When renewals cannot get through, the leader stops reporting IsLeader at its trust
// deadline, while the database still has its grant: it never believes it leads longer than
// the database would let it.
func TestElectorStopsTrustingAtTheTrustDeadline(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	c := newElectorCandidate(t, pool, leases.ElectorConfig{
		Name: "stalled", TTL: 900 * time.Millisecond, SafetyMargin: 300 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, Cooldown: time.Minute,
	})
	electorWait(t, 10*time.Second, "leader", c.IsLeader)
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = 'stalled' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	l, _ := c.Leader()
	electorWait(t, 10*time.Second, "IsLeader false with renewals blocked", func() bool { return !c.IsLeader() })
	var stillGranted bool
	var token int64
	if err := blocker.QueryRow(ctx, `SELECT expires_at > clock_timestamp(), fence_token FROM pgcoord_leases WHERE name = 'stalled'`).
		Scan(&stillGranted, &token); err != nil {
		t.Fatal(err)
	}
	if !stillGranted {
		t.Error("the leader stopped trusting its lease only after the database expired it")
	}
	if token != l.Token {
		t.Errorf("lease token %d, want the leader's %d", token, l.Token)
	}
	// The keeper's own deadline ends the term (it may come a little after IsLeader's, which
	// is refreshed by reads of the lease), with renewals still blocked.
	electorWait(t, 10*time.Second, "the term ends", func() bool {
		terms, _, _ := c.snapshot()
		return !terms[0].end.IsZero()
	})
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	electorWait(t, 10*time.Second, "OnStoppedLeading", func() bool {
		_, _, stopped := c.snapshot()
		return stopped == 1
	})
	terms, _, _ := c.snapshot()
	if !errors.Is(terms[0].cause, leases.ErrLost) {
		t.Errorf("the term ended with %v, want ErrLost", terms[0].cause)
	}
}

// A leader whose function returns resigns, and campaigns again after its cooldown.
func TestElectorResignsWhenTheLeaderFunctionReturns(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	c := newElectorCandidate(t, pool, leases.ElectorConfig{Name: "once", TTL: time.Minute, Cooldown: 10 * time.Millisecond})
	electorWait(t, 10*time.Second, "leader", c.IsLeader)
	first, _ := c.Leader()
	c.quit <- struct{}{}
	electorWait(t, 10*time.Second, "a second term", func() bool {
		terms, _, _ := c.snapshot()
		return len(terms) == 2
	})
	terms, leaders, stopped := c.snapshot()
	if terms[1].token <= first.Token || stopped != 1 {
		t.Errorf("terms %+v, OnStoppedLeading %d times; want a second grant after one stop", terms, stopped)
	}
	if !slices.Equal(leaders, []string{c.Holder()}) {
		t.Errorf("OnNewLeader got %v, want itself once (the leader did not change)", leaders)
	}
	c.stop()
	info, err := leases.Get(ctx, pool, "once")
	if err != nil || info.Held() {
		t.Fatalf("after Run returned the lease is %+v (%v), want released", info, err)
	}
}

// Without OnStartedLeading an elector just holds leadership (for callers that only ask
// IsLeader), and a second Run of the same Elector is refused.
func TestElectorWithoutFunctionAndRunTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	e, err := leases.NewElector(pool, &leases.ElectorConfig{Name: "bare", TTL: 600 * time.Millisecond, Metrics: &leases.Metrics{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	electorWait(t, 10*time.Second, "leader", e.IsLeader)
	if err := e.Run(ctx); !errors.Is(err, leases.ErrElectorRunning) {
		t.Fatalf("second Run = %v, want ErrElectorRunning", err)
	}
	first, _ := e.Leader()
	// Leadership outlives several TTLs: the lease is renewed and the trust deadline moves.
	electorWait(t, 10*time.Second, "the same grant trusted 3 TTLs later", func() bool {
		l, ok := e.Leader()
		return ok && l.Token == first.Token && l.TrustUntil.After(first.TrustUntil.Add(1800*time.Millisecond))
	})
	if info, err := leases.Get(ctx, pool, "bare"); err != nil || info.Token != first.Token || info.Holder != e.Holder() || !info.Held() {
		t.Fatalf("the lease is %+v (%v), want still held with the first grant", info, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if e.IsLeader() {
		t.Fatal("IsLeader after Run returned")
	}
}

func TestNewElectorRejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for _, tc := range []struct {
		name string
		cfg  *leases.ElectorConfig
	}{
		{"nil config", nil},
		{"empty name", &leases.ElectorConfig{}},
		{"ttl too long", &leases.ElectorConfig{Name: "x", TTL: 48 * time.Hour}},
		{"negative ttl", &leases.ElectorConfig{Name: "x", TTL: -time.Second}},
		{"renew not below ttl", &leases.ElectorConfig{Name: "x", TTL: time.Second, RenewEvery: time.Second}},
		{"renew past the trust deadline", &leases.ElectorConfig{Name: "x", TTL: time.Second, SafetyMargin: 500 * time.Millisecond, RenewEvery: 600 * time.Millisecond}},
		{"margin not below ttl", &leases.ElectorConfig{Name: "x", TTL: time.Second, SafetyMargin: time.Second}},
		{"negative poll", &leases.ElectorConfig{Name: "x", PollInterval: -time.Second}},
		{"bad holder", &leases.ElectorConfig{Name: "x", Holder: string(make([]byte, 300))}},
		{"sync commit off", &leases.ElectorConfig{Name: "x", SyncCommit: "off"}},
	} {
		_, err := leases.NewElector(pool, tc.cfg)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
			t.Errorf("%s: NewElector = %v, want ErrInvalidArgument or ErrInvalidName", tc.name, err)
		}
	}
	if _, err := leases.NewElector(nil, &leases.ElectorConfig{Name: "x"}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("nil pool: %v", err)
	}
	e, err := leases.NewElector(pool, &leases.ElectorConfig{Name: "x"})
	if err != nil || e.Holder() == "" || e.Name() != "x" || e.IsLeader() || e.ObservedLeader() != "" {
		t.Fatalf("defaults: %v, %v", e, err)
	}
}
