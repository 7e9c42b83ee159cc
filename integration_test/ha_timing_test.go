//go:build unix

package integration_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// What a failover costs, measured in TestHAFailovers (docs/ha.md#timing): for each fault,
// how long the database took no writes, against how long pgcoord's workers got no grant.
// The database's own availability is a probe that commits a row every 100 ms through a fresh
// connection of the multi-host URL; the workers' is the replies of their grants. Both are
// told apart by timeline, so "back on the new primary" means a commit or a grant made there.

// haFaultRun is one injected fault: its kind, when it began, when the cluster was whole
// again, and the leader's timeline before it.
type haFaultRun struct {
	kind         string
	began, ended time.Time
	tl           int
}

// haSuccess is a write that was acknowledged: when, and on which timeline.
type haSuccess struct {
	at time.Time
	tl int
}

// haProbe commits a row every 100 ms on whichever node the multi-host URL finds writable.
type haProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	ok     []haSuccess
}

// startHAProbe creates the probe's table in the fault schema and starts it.
func startHAProbe(t *testing.T, h *faultHarness, url string) *haProbe {
	if _, err := h.admin.Exec(h.ctx, `CREATE TABLE ha_probe (at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	p := &haProbe{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for ctx.Err() == nil {
			if tl, err := haProbeCommit(ctx, url); err == nil {
				p.mu.Lock()
				p.ok = append(p.ok, haSuccess{time.Now(), tl})
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

// haProbeCommit commits one row through a new connection and returns the timeline it was
// committed on. A commit that waits for a standby past 3 s counts as not acknowledged.
func haProbeCommit(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var tl int
	err = conn.QueryRow(ctx, `WITH probe AS (INSERT INTO `+faultSchema+`.ha_probe DEFAULT VALUES)
		SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int`).Scan(&tl)
	return tl, err
}

// stop ends the probe and returns its commits.
func (p *haProbe) stop() []haSuccess {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok
}

// haGrantTimeline is the timeline a fence token was granted on: tokens of timeline n start
// at (n-1) << 44 (pgcoord_token_floor).
func haGrantTimeline(token int64) int { return int(token>>44) + 1 }

// reportHATimings logs, for each fault, how long writes stopped for the probe and for the
// workers' grants, when each was first acknowledged on a new timeline, and what the workers
// saw meanwhile; then, for each kind of fault, the median and the worst over the run.
func reportHATimings(t *testing.T, runs []haFaultRun, probe []haSuccess, hist *faultHistory) {
	var grants []haSuccess
	for _, op := range hist.ops {
		if op.grant && op.outcome == "granted" && op.ret != 0 {
			grants = append(grants, haSuccess{time.Unix(0, op.ret), haGrantTimeline(op.token)})
		}
	}
	slices.SortFunc(grants, func(a, b haSuccess) int { return a.at.Compare(b.at) })
	type sample struct{ dbOut, grantOut, dbNew, grantNew time.Duration }
	byKind := map[string][]sample{}
	for _, r := range runs {
		s := sample{
			dbOut: haLongestGap(probe, r), grantOut: haLongestGap(grants, r),
			dbNew: haFirstOnNewTimeline(probe, r), grantNew: haFirstOnNewTimeline(grants, r),
		}
		byKind[r.kind] = append(byKind[r.kind], s)
		seen := map[string]int{}
		for _, op := range hist.ops {
			if at := time.Unix(0, op.ret); op.grant && op.outcome == "held" && !at.Before(r.began) && !at.After(r.ended) {
				seen["held"]++
			}
		}
		for _, e := range hist.errs {
			if at := time.Unix(0, e.at); !at.Before(r.began) && !at.After(r.ended) {
				seen[e.class]++
			}
		}
		var saw []string
		for _, class := range slices.Sorted(maps.Keys(seen)) {
			saw = append(saw, fmt.Sprintf("%s %d", class, seen[class]))
		}
		t.Logf("timing: %-30s writes stopped %6s (grants %6s); first on a new timeline %6s (grants %6s); grant attempts refused or failed: %s",
			r.kind, haSeconds(s.dbOut), haSeconds(s.grantOut), haSeconds(s.dbNew), haSeconds(s.grantNew), cmp.Or(strings.Join(saw, ", "), "none"))
	}
	for _, kind := range slices.Sorted(maps.Keys(byKind)) {
		ss := byKind[kind]
		stat := func(f func(sample) time.Duration) string {
			var ds []time.Duration
			for _, s := range ss {
				if d := f(s); d >= 0 {
					ds = append(ds, d)
				}
			}
			if len(ds) == 0 {
				return "-"
			}
			slices.Sort(ds)
			return fmt.Sprintf("%s/%s", haSeconds(ds[(len(ds)-1)/2]), haSeconds(ds[len(ds)-1]))
		}
		t.Logf("timing summary (median/worst of %d): %-30s writes stopped %s (grants %s); first on a new timeline %s (grants %s)",
			len(ss), kind, stat(func(s sample) time.Duration { return s.dbOut }), stat(func(s sample) time.Duration { return s.grantOut }),
			stat(func(s sample) time.Duration { return s.dbNew }), stat(func(s sample) time.Duration { return s.grantNew }))
	}
}

// haLongestGap is the longest time without an acknowledged write between the fault's start
// and the cluster being whole again (all of it, if none was acknowledged).
func haLongestGap(ok []haSuccess, r haFaultRun) time.Duration {
	prev, longest := r.began, time.Duration(0)
	for _, s := range ok {
		if s.at.Before(r.began) || s.at.After(r.ended) {
			continue
		}
		longest = max(longest, s.at.Sub(prev))
		prev = s.at
	}
	if prev.Equal(r.began) {
		return r.ended.Sub(r.began)
	}
	return longest
}

// haFirstOnNewTimeline is how long after the fault's start the first write was acknowledged
// on a timeline above the one before it, or -1 if none was before the cluster was whole.
func haFirstOnNewTimeline(ok []haSuccess, r haFaultRun) time.Duration {
	for _, s := range ok {
		if !s.at.Before(r.began) && !s.at.After(r.ended) && s.tl > r.tl {
			return s.at.Sub(r.began)
		}
	}
	return -1
}

func haSeconds(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
