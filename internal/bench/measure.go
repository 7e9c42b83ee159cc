package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// rounds splits d into rounds of about round each: at least one, and at least 3 when that
// leaves rounds of 50ms or more.
func rounds(d, round time.Duration) int {
	n := int(d / round)
	n = max(n, min(3, int(d/(50*time.Millisecond))), 1)
	return n
}

// measure runs p's scenario (and its floor, alternating) at concurrency c.
func measure(ctx context.Context, pool *pgxpool.Pool, p pair, c int, o Options) (Result, error) {
	round := o.Round
	if p.a.Round > 0 {
		round = p.a.Round
	}
	n := rounds(o.Duration, round)
	per := o.Duration / time.Duration(n)
	res := Result{Scenario: p.a.Name, Concurrency: c, Floor: p.a.Name, Rounds: n}
	if p.floor != nil {
		res.Floor = p.floor.Name
	}
	if o.Progress != nil {
		o.Progress(Progress{Scenario: res.Scenario, Floor: res.Floor, Concurrency: c, Rounds: n, RoundLength: per})
	}
	where := fmt.Sprintf("bench: %s c=%d", p.a.Name, c)

	conns := make([]*pgxpool.Conn, 0, c)
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	for range c {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return res, fmt.Errorf("%s: acquire connection: %w", where, err)
		}
		conns = append(conns, conn)
	}
	cl := &cleanups{}
	defer cl.run()
	aOps, err := newWorkers(ctx, p.a, conns, cl)
	if err != nil {
		return res, fmt.Errorf("%s: %w", where, err)
	}
	var fOps []Op
	if p.floor != nil {
		if fOps, err = newWorkers(ctx, *p.floor, conns, cl); err != nil {
			return res, fmt.Errorf("%s: floor %w", where, err)
		}
	}

	hists := make([]histogram, c)
	aRates := make([]float64, 0, n)
	fRates := make([]float64, 0, n)
	var before, after runtime.MemStats
	var mallocs, bytes uint64
	for range n {
		// The whole process's allocations during the scenario's rounds: its workers' client-side
		// cost. Read outside the round, so throughput is measured as before.
		runtime.ReadMemStats(&before)
		ops, rate, err := runRound(ctx, aOps, per, hists)
		if err != nil {
			return res, fmt.Errorf("%s: %w", where, err)
		}
		runtime.ReadMemStats(&after)
		mallocs += after.Mallocs - before.Mallocs
		bytes += after.TotalAlloc - before.TotalAlloc
		res.Ops += ops
		aRates = append(aRates, rate)
		if p.floor != nil {
			_, rate, err := runRound(ctx, fOps, per, nil)
			if err != nil {
				return res, fmt.Errorf("%s: floor %s: %w", where, p.floor.Name, err)
			}
			fRates = append(fRates, rate)
		}
	}
	if p.floor == nil {
		fRates = aRates
	}
	res.RoundOpsPerSec, res.FloorRoundOpsPerSec = aRates, fRates
	res.OpsPerSec, res.FloorOpsPerSec, res.Ratio = ratioOfMedians(aRates, fRates)
	if res.Ops > 0 {
		res.AllocsPerOp = float64(mallocs) / float64(res.Ops)
		res.BytesPerOp = float64(bytes) / float64(res.Ops)
	}
	var all histogram
	for i := range hists {
		all.merge(&hists[i])
	}
	res.P50, res.P99 = all.quantile(0.50), all.quantile(0.99)
	return res, nil
}

// newWorkers creates the workers of s, one per connection; the functions they register
// with Worker.Cleanup go to cl.
func newWorkers(ctx context.Context, s Scenario, conns []*pgxpool.Conn, cl *cleanups) ([]Op, error) {
	ops := make([]Op, len(conns))
	for i, conn := range conns {
		op, err := s.NewWorker(ctx, Worker{ID: i, Concurrency: len(conns), Conn: conn, cleanups: cl})
		if err != nil {
			return nil, fmt.Errorf("%s: worker %d: %w", s.Name, i, err)
		}
		if op == nil {
			return nil, fmt.Errorf("%s: worker %d: NewWorker returned a nil Op", s.Name, i)
		}
		ops[i] = op
	}
	return ops, nil
}

// reportKey keys, in an op's context, the *opReport of the op.
type reportKey struct{}

// opReport is what an op says about itself: the operations it counts as, and the latencies
// it recorded itself.
type opReport struct {
	units    int64
	hist     *histogram // the worker's, or nil when the round records no latency
	recorded bool       // the op recorded its latencies itself
}

// setUnits says that the op running with ctx did n operations (the messages it delivered,
// say), not one: its round counts n. An op that does not call it counts as one.
func setUnits(ctx context.Context, n int64) {
	if r, ok := ctx.Value(reportKey{}).(*opReport); ok {
		r.units = n
	}
}

// recordLatency records d as the latency of one of the op's operations (a tick's lateness,
// say), in place of the op's duration: an op that calls it, once or more, adds to the
// latency percentiles what it recorded and not its own duration.
func recordLatency(ctx context.Context, d time.Duration) {
	if r, ok := ctx.Value(reportKey{}).(*opReport); ok {
		r.recorded = true
		if r.hist != nil {
			r.hist.record(d)
		}
	}
}

// runRound runs every op in its own goroutine, again and again, until d has passed (an op
// started before then completes and counts). Each op runs at least once, however late its
// goroutine starts on a busy machine: a round that measured nothing would be a lie. It returns the number of ops completed (each
// counted as setUnits said) and their rate over the round's wall time. It records each
// op's latency (or those it recorded itself, with recordLatency) in hists[worker] when
// hists is not nil. The first error stops the round and is returned.
func runRound(ctx context.Context, ops []Op, d time.Duration, hists []histogram) (int64, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	counts := make([]int64, len(ops))
	start := time.Now()
	end := start.Add(d)
	for i, op := range ops {
		var h *histogram
		if hists != nil {
			h = &hists[i]
		}
		wg.Go(func() {
			var n int64
			report := &opReport{hist: h}
			opCtx := context.WithValue(ctx, reportKey{}, report)
			for first := true; ; first = false {
				t0 := time.Now()
				if !first && !t0.Before(end) {
					break
				}
				report.units, report.recorded = 1, false
				if err := op(opCtx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("worker %d: %w", i, err)
						cancel() // the other workers' errors are consequences
					}
					mu.Unlock()
					break
				}
				if h != nil && !report.recorded {
					h.record(time.Since(t0))
				}
				n += report.units
			}
			counts[i] = n
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, 0, firstErr
	}
	var total int64
	for _, n := range counts {
		total += n
	}
	return total, float64(total) / elapsed.Seconds(), nil
}

// median returns the median of xs (the mean of the middle two for an even count), 0 for
// none. It does not modify xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// ratioOfMedians returns the medians of a and of floor and their ratio (0 when the floor's
// median is 0).
func ratioOfMedians(a, floor []float64) (ma, mf, ratio float64) {
	ma, mf = median(a), median(floor)
	if mf > 0 {
		ratio = ma / mf
	}
	return ma, mf, ratio
}
