package leases_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

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
	// A TTL with room for a slow round trip: with 900ms, a loaded machine (-race beside CPU
	// hogs) has seen the first grant's reply come after its trust deadline.
	c := newElectorCandidate(t, pool, leases.ElectorConfig{
		Name: "stalled", TTL: 3 * time.Second, SafetyMargin: time.Second,
		PollInterval: 50 * time.Millisecond, Cooldown: time.Minute,
	})
	electorWait(t, 2*pgtest.WaitLimit, "leader", c.IsLeader)
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgcoord_leases WHERE name = 'stalled' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	l, _ := c.Leader()
	electorWait(t, 2*pgtest.WaitLimit, "IsLeader false with renewals blocked", func() bool { return !c.IsLeader() })
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
	electorWait(t, 2*pgtest.WaitLimit, "the term ends", func() bool {
		terms, _, _ := c.snapshot()
		return !terms[0].end.IsZero()
	})
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	electorWait(t, 2*pgtest.WaitLimit, "OnStoppedLeading", func() bool {
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
	// A 2 s TTL: a busy machine (CI runs the suite beside CPU hogs) may delay a renewal by
	// a few hundred milliseconds, which a shorter TTL would not survive.
	e, err := leases.NewElector(pool, &leases.ElectorConfig{Name: "bare", TTL: 2 * time.Second, Metrics: &leases.Metrics{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() { // Run stops, and logs no more, before the test ends
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})
	electorWait(t, 10*time.Second, "leader", e.IsLeader)
	if err := e.Run(ctx); !errors.Is(err, leases.ErrElectorRunning) {
		t.Fatalf("second Run = %v, want ErrElectorRunning", err)
	}
	first, _ := e.Leader()
	// Leadership outlives several TTLs: the lease is renewed and the trust deadline moves.
	electorWait(t, 30*time.Second, "the same grant trusted 2 TTLs later", func() bool {
		l, ok := e.Leader()
		return ok && l.Token == first.Token && l.TrustUntil.After(first.TrustUntil.Add(4*time.Second))
	})
	if info, err := leases.Get(ctx, pool, "bare"); err != nil || info.Token != first.Token || info.Holder != e.Holder() || !info.Held() {
		t.Fatalf("the lease is %+v (%v), want still held with the first grant", info, err)
	}
	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup
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
