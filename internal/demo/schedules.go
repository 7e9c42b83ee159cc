//go:build unix

package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/schedules"
)

// Epilogue, schedules as data. The weekly report of incident 2 was a job in code; support
// now wants to pause a schedule without a deploy. A schedule is a row: "every two seconds,
// Berlin time", run by three replicas (each tick once), paused from the CLI by support
// with a note, and resumed. No tick runs while it is paused.

const (
	scheduleRole     = "schedules"
	scheduleReplicas = 3
	scheduleName     = "digest"
	// scheduleTicks is how many ticks run before the pause, and again after the resume.
	scheduleTicks = 2
	// schedulePause is how long the schedule stays paused: several of its ticks.
	schedulePause = 5 * time.Second
)

// ScheduleResult is what the epilogue observed: the ticks run before the pause, while
// paused, and after the resume, and whether any tick ran twice.
type ScheduleResult struct {
	Before, WhilePaused, After int
	RanTwice                   int
	Replicas                   int // how many replicas ran ticks
}

func (d *demo) schedules(ctx context.Context) (ScheduleResult, error) {
	var res ScheduleResult
	d.step("schedules: three replicas run a schedule; support pauses and resumes it from the CLI")
	if _, err := schedules.Create(ctx, d.pool, schedules.Schedule{Name: scheduleName, Expr: "*/2 * * * * *",
		Zone: "Europe/Berlin", Handler: scheduleName}, &schedules.ChangeOpts{Actor: "ops"}); err != nil {
		return res, err
	}
	var procs []*workerproc.Proc
	for i := 1; i <= scheduleReplicas; i++ {
		p, err := d.start("replica-"+strconv.Itoa(i), scheduleRole, map[string]string{"NAME": "replica-" + strconv.Itoa(i)})
		if err != nil {
			return res, err
		}
		defer p.Stop(5 * time.Second)
		procs = append(procs, p)
	}
	defer workerproc.NewGroup(procs...).Send("stop")
	if err := d.waitTicks(ctx, scheduleTicks); err != nil {
		return res, err
	}
	cliOut := func(args ...string) error {
		fmt.Fprintf(d.Out, "   $ pgcoord %s\n", joinArgs(args))
		all := append([]string{"--database-url", d.url, "--schema", d.schema, "--actor", "support"}, args...)
		if code := cli.Run(ctx, all, indent{d.Out}, indent{d.Out}); code != cli.ExitOK {
			return fmt.Errorf("pgcoord %v: exit code %d", args, code)
		}
		return nil
	}
	fmt.Fprintf(d.Out, "\n4. Schedules as data: %q every two seconds, Berlin time, on %d replicas; support pauses it.\n",
		scheduleName, scheduleReplicas)
	if err := cliOut("schedules", "pause", scheduleName, "--note", "customer asked for a break"); err != nil {
		return res, err
	}
	time.Sleep(schedulePause) // the demo lets a few of the schedule's ticks pass while it is paused
	if err := cliOut("schedules", "resume", scheduleName); err != nil {
		return res, err
	}
	var before int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM demo_schedule_runs`).Scan(&before); err != nil {
		return res, err
	}
	if err := d.waitTicks(ctx, before+scheduleTicks); err != nil {
		return res, err
	}
	// Judged by the database clock: the claims (the ledger's started_at) against the
	// change's audit rows.
	err := d.pool.QueryRow(ctx, `
		WITH changes AS (
			SELECT max(at) FILTER (WHERE action = 'schedule.pause') AS paused,
			       max(at) FILTER (WHERE action = 'schedule.resume') AS resumed
			  FROM pgcoord_audit WHERE target = $1),
		runs AS (SELECT r.scheduled_for, r.started_at FROM pgcoord_job_runs r WHERE r.job = $1 AND r.state <> 'skipped')
		SELECT (SELECT count(*) FROM runs, changes WHERE runs.started_at < changes.paused),
		       (SELECT count(*) FROM runs, changes WHERE runs.started_at BETWEEN changes.paused AND changes.resumed),
		       (SELECT count(*) FROM runs, changes WHERE runs.started_at > changes.resumed),
		       (SELECT count(*) FROM (SELECT tick FROM demo_schedule_runs GROUP BY tick HAVING count(*) > 1) twice),
		       (SELECT count(DISTINCT replica) FROM demo_schedule_runs)`, scheduleName).
		Scan(&res.Before, &res.WhilePaused, &res.After, &res.RanTwice, &res.Replicas)
	return res, err
}

// waitTicks waits until n ticks of the schedule have run.
func (d *demo) waitTicks(ctx context.Context, n int) error {
	deadline := time.Now().Add(stepTimeout)
	for {
		var got int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM demo_schedule_runs`).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d ticks of %s ran within %v", got, n, scheduleName, stepTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scheduleWorker is one replica: a Scheduler with the digest handler, which records each
// run. It stops on "stop".
func scheduleWorker(ctx context.Context, w *workerproc.Worker) error {
	name := w.Param("NAME")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = w.Await("stop")
		cancel()
	}()
	s, err := schedules.New(schedules.Config{Pool: w.Pool, Holder: name, Logger: slog.New(slog.DiscardHandler),
		Handlers: map[string]schedules.Handler{scheduleName: func(ctx context.Context, run schedules.Run) error {
			_, err := w.Pool.Exec(ctx, `INSERT INTO demo_schedule_runs (tick, replica) VALUES ($1, $2)`, run.Tick, name)
			return err
		}}})
	if err != nil {
		return err
	}
	if err := s.Run(sctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (r ScheduleResult) print(out io.Writer) {
	fmt.Fprintf(out, `
   ticks run before the pause %d, while paused %d, after the resume %d; on %d replicas, none twice: %v
`, r.Before, r.WhilePaused, r.After, r.Replicas, r.RanTwice == 0)
}

// indent writes each line it is given indented, under the report's item.
type indent struct{ w io.Writer }

func (i indent) Write(p []byte) (int, error) {
	start := 0
	for j, b := range p {
		if b == '\n' {
			if _, err := fmt.Fprintf(i.w, "     %s\n", p[start:j]); err != nil {
				return 0, err
			}
			start = j + 1
		}
	}
	if start < len(p) {
		if _, err := fmt.Fprintf(i.w, "     %s", p[start:]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// joinArgs shows a command's arguments as a shell would take them.
func joinArgs(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsRune(a, ' ') {
			a = strconv.Quote(a)
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}
