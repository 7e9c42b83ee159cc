package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/schedules"
)

// schedules.lateness
//
// How late the Schedulers of three replicas start the handlers of the ticks they share,
// by the database clock. The measurement (worker 0; it runs at concurrency 1 only):
//
//	NewWorker stores latenessSchedules schedules of one handler, as rows in one statement
//	   (each call of the SQL API validates its zone against pg_timezone_names, which costs
//	   tens of milliseconds): schedule i fires at second i mod 60 of every minute
//	   ("S * * * * *"), so that each second about latenessSchedules/60 ticks fall due at once;
//	it starts latenessReplicas Schedulers, each on a pool of its own (latenessConns
//	   connections), whose handler passes each run, with the local time it started, to the
//	   worker; it lets them run for latenessWarmup, and registers their stop as a Cleanup;
//	one op is one second of ticks: it waits until every tick of that second has started its
//	   handler, counts them (ops/s is ticks run per second), and records each one's
//	   lateness, from its tick (Run.Tick, the database clock) to its handler's start (the
//	   local clock, put on the database clock by an offset measured beforehand: the best
//	   of latenessClockSamples round trips of SELECT pgcoord_now(), so within half of it);
//	a tick that starts its handler twice fails the op, and so does a second whose ticks
//	   did not all start within latenessPatience: a result means each tick ran once.
//
// Its rounds last a second (Scenario.Round), as one op does, and it is its own reference:
// the ticks come by the clock, whatever a floor would do, so only its latencies mean
// anything beside another run's.

// The shape of schedules.lateness.
const (
	latenessReplicas     = 3
	latenessConns        = 4
	latenessHandler      = "bench"
	latenessWarmup       = 2 * time.Second
	latenessPatience     = 20 * time.Second
	latenessClockSamples = 5
)

// latenessSchedules is how many schedules schedules.lateness runs; tests lower it.
var latenessSchedules = 10000

func init() {
	Register(Scenario{
		Name: "schedules.lateness",
		Description: fmt.Sprintf("%d Schedulers (as %d replicas, a pool of %d connections each) run one handler for "+
			"%d schedules, schedule i at second i mod 60 of every minute (\"S * * * * *\": about %d ticks due at once "+
			"each second); an op is one second of ticks: ops/s is ticks run per second, the percentiles are their "+
			"lateness, from the tick (Run.Tick) to the handler's start (local clock, put on the database clock by an "+
			"offset measured over the best of %d round trips); it fails if a tick ran twice or not within %v",
			latenessReplicas, latenessReplicas, latenessConns, latenessSchedules, latenessSchedules/60,
			latenessClockSamples, latenessPatience),
		NewWorker:      newLatenessWorker,
		MaxConcurrency: 1,
		Round:          time.Second,
	})
}

// tickRun is a run as the handler saw it start, by the local clock.
type tickRun struct {
	schedule string
	tick     time.Time
	started  time.Time
}

// latenessWorker is the state of the schedules.lateness worker.
type latenessWorker struct {
	n      int
	runs   chan tickRun
	failed chan error           // a Scheduler's Run returned early
	offset time.Duration        // the database clock minus the local clock
	last   map[string]time.Time // the last tick that ran, by schedule
	first  int64                // the first second measured (Unix seconds): those before are the warm-up
	next   int64                // the second the next op measures
	late   map[int64][]time.Duration
}

func newLatenessWorker(ctx context.Context, w Worker) (Op, error) {
	lw := &latenessWorker{
		n: latenessSchedules, runs: make(chan tickRun, latenessSchedules), failed: make(chan error, latenessReplicas),
		last: map[string]time.Time{}, late: map[int64][]time.Duration{},
	}
	// Schedule i's next tick is the first second i mod 60 after now.
	err := insertSchedules(ctx, w.Conn, `
		SELECT 'lateness/' || g AS name, (g % 60) || ' * * * * *' AS expr, $2::text AS handler,
		       CASE WHEN t.at > pgcoord_now() THEN t.at ELSE t.at + interval '1 minute' END AS at
		  FROM generate_series(0, $1::int - 1) g,
		       LATERAL (SELECT date_trunc('minute', pgcoord_now()) + (g % 60) * interval '1 second' AS at) t`,
		lw.n, latenessHandler)
	if err != nil {
		return nil, fmt.Errorf("bench: schedules.lateness: create the schedules: %w", err)
	}
	if lw.offset, err = dbClockOffset(ctx, w.Conn); err != nil {
		return nil, fmt.Errorf("bench: schedules.lateness: %w", err)
	}
	stop, err := lw.startSchedulers(ctx, w)
	if err != nil {
		return nil, err
	}
	w.Cleanup(stop)
	// The warm-up: the ticks of the seconds before the first measured start the
	// Schedulers' pools and plans.
	lw.first = time.Now().Add(lw.offset+latenessWarmup).Truncate(time.Second).Unix() + 1
	lw.next = lw.first
	timer := time.NewTimer(latenessWarmup + latenessPatience)
	defer timer.Stop()
	for seen := false; !seen; {
		select {
		case r := <-lw.runs:
			if err := lw.accept(r); err != nil {
				return nil, err
			}
			seen = r.tick.Unix() >= lw.first
		case err := <-lw.failed:
			return nil, fmt.Errorf("bench: schedules.lateness: a Scheduler stopped: %w", err)
		case <-timer.C:
			return nil, fmt.Errorf("bench: schedules.lateness: no tick ran after the warm-up within %v", latenessPatience)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return lw.op, nil
}

// startSchedulers starts the Schedulers, each on a pool of its own made like w's
// connection, and returns the function that stops them and closes their pools.
func (lw *latenessWorker) startSchedulers(ctx context.Context, w Worker) (stop func(), err error) {
	cfg, err := connPoolConfig(w.Conn.Conn())
	if err != nil {
		return nil, fmt.Errorf("bench: schedules.lateness: %w", err)
	}
	cfg.MaxConns = latenessConns
	sctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		pools []*pgxpool.Pool
	)
	stop = func() {
		cancel()
		wg.Wait()
		for _, p := range pools {
			p.Close()
		}
	}
	handler := func(ctx context.Context, run schedules.Run) error {
		r := tickRun{schedule: run.Schedule, tick: run.Tick, started: time.Now()}
		select {
		case lw.runs <- r:
			return nil
		default: // the worker is latenessSchedules runs behind
		}
		select {
		case lw.runs <- r:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for range latenessReplicas {
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			stop()
			return nil, fmt.Errorf("bench: schedules.lateness: %w", err)
		}
		pools = append(pools, pool)
		s, err := schedules.New(schedules.Config{Pool: pool, Handlers: map[string]schedules.Handler{latenessHandler: handler}})
		if err != nil {
			stop()
			return nil, fmt.Errorf("bench: schedules.lateness: %w", err)
		}
		wg.Go(func() {
			if err := s.Run(sctx); sctx.Err() == nil {
				lw.failed <- err
			}
		})
	}
	return stop, nil
}

func (lw *latenessWorker) op(ctx context.Context) error {
	sec := lw.next
	lw.next++
	want := lw.ticksAt(sec)
	timer := time.NewTimer(latenessPatience)
	defer timer.Stop()
	for len(lw.late[sec]) < want {
		select {
		case r := <-lw.runs:
			if err := lw.accept(r); err != nil {
				return err
			}
		case err := <-lw.failed:
			return fmt.Errorf("bench: schedules.lateness: a Scheduler stopped: %w", err)
		case <-timer.C:
			return fmt.Errorf("bench: schedules.lateness: %d of the %d ticks at %s ran within %v", len(lw.late[sec]), want,
				time.Unix(sec, 0).UTC().Format(time.TimeOnly), latenessPatience)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, d := range lw.late[sec] {
		recordLatency(ctx, d)
	}
	delete(lw.late, sec)
	setUnits(ctx, int64(want))
	return nil
}

// ticksAt returns how many ticks fall on the second sec (Unix seconds): one of each
// schedule whose number is sec modulo 60.
func (lw *latenessWorker) ticksAt(sec int64) int {
	s := int(sec % 60)
	n := lw.n / 60
	if s < lw.n%60 {
		n++
	}
	return n
}

// accept takes a run the handler saw: it fails if its schedule ran that tick (or a later
// one) already, or skipped a tick since the one before, and keeps its lateness if its
// second is measured.
func (lw *latenessWorker) accept(r tickRun) error {
	last, ok := lw.last[r.schedule]
	switch {
	case ok && !r.tick.After(last):
		return fmt.Errorf("bench: schedules.lateness: %s ran its tick %s after its tick %s: a tick ran twice",
			r.schedule, r.tick.UTC().Format(time.TimeOnly), last.UTC().Format(time.TimeOnly))
	case ok && r.tick.Sub(last) != time.Minute:
		return fmt.Errorf("bench: schedules.lateness: %s ran its tick %s after its tick %s: ticks were missed",
			r.schedule, r.tick.UTC().Format(time.TimeOnly), last.UTC().Format(time.TimeOnly))
	}
	lw.last[r.schedule] = r.tick
	sec := r.tick.Unix()
	if sec < lw.first {
		return nil // the warm-up
	}
	if sec < lw.next-1 || r.tick.Nanosecond() != 0 || !lw.scheduledAt(r.schedule, sec) {
		return fmt.Errorf("bench: schedules.lateness: %s ran a tick at %s, which is not one of its ticks still to come",
			r.schedule, r.tick.UTC().Format(time.RFC3339Nano))
	}
	lw.late[sec] = append(lw.late[sec], r.started.Add(lw.offset).Sub(r.tick))
	return nil
}

// scheduledAt reports whether schedule ("lateness/i") ticks on the second sec.
func (lw *latenessWorker) scheduledAt(schedule string, sec int64) bool {
	i, err := strconv.Atoi(strings.TrimPrefix(schedule, "lateness/"))
	return err == nil && int64(i%60) == sec%60
}

// dbClockOffset returns the database clock minus the local one: of latenessClockSamples
// reads of pgcoord_now(), the one with the shortest round trip, against the middle of it.
func dbClockOffset(ctx context.Context, conn *pgxpool.Conn) (time.Duration, error) {
	var best, offset time.Duration
	for i := range latenessClockSamples {
		var dbNow time.Time
		sent := time.Now()
		if err := conn.QueryRow(ctx, `SELECT pgcoord_now()`).Scan(&dbNow); err != nil {
			return 0, fmt.Errorf("read the database clock: %w", err)
		}
		rtt := time.Since(sent)
		if i == 0 || rtt < best {
			best, offset = rtt, dbNow.Sub(sent.Add(rtt/2))
		}
	}
	if best <= 0 {
		return 0, errors.New("read the database clock: no round trip measured")
	}
	return offset, nil
}

// insertSchedules stores, as rows (a bulk load: armed, without the SQL API's checks and
// audit), the schedules that the query rows lists as (name, expr, handler, at): at is the
// next tick, by expr in UTC. Their catch-up window is an hour (policy latest), their
// overlap policy skip, and they have no jitter.
func insertSchedules(ctx context.Context, db pgcoord.DBTX, rows string, args ...any) error {
	_, err := db.Exec(ctx, `
		WITH s AS (`+rows+`),
		     j AS (INSERT INTO pgcoord_jobs (name, kind, overlap) SELECT name, 'cron', 'forbid' FROM s)
		INSERT INTO pgcoord_schedules (name, expr, zone, handler, catch_up, catch_up_policy, jitter, next_at, due_at, updated_by)
		SELECT name, expr, 'UTC', handler, interval '1 hour', 'latest', interval '0', at, at, 'pgcoord bench' FROM s`, args...)
	return err
}
