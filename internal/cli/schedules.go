package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/schedules"
)

// nextTicksShown is how many fire times `schedules get` shows.
const nextTicksShown = 5

func (a *app) schedulesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "Operate schedules: cron expressions in a time zone, each tick run once across replicas",
		Long: `Operate pgcoord's schedules (package schedules): cron expressions read in an IANA time zone,
stored as rows, each tick claimed by one replica running a Scheduler with the schedule's
handler. A change applies from the first tick after it, with no restart. Every change is
audited (--actor names who makes it).`,
	}
	cmd.AddCommand(a.schedulesListCommand(), a.schedulesGetCommand(), a.schedulesCreateCommand(),
		a.schedulesUpdateCommand(), a.schedulesPauseCommand(), a.schedulesResumeCommand(),
		a.schedulesTriggerCommand(), a.schedulesBackfillCommand(), a.schedulesDeleteCommand())
	return cmd
}

// scheduleJSON is a schedule in `schedules list --json` and the other verbs' --json.
type scheduleJSON struct {
	Name                string          `json:"name"`
	Expr                string          `json:"expr"`
	Zone                string          `json:"zone"`
	Handler             string          `json:"handler"`
	Args                json.RawMessage `json:"args"`
	CatchUpSeconds      float64         `json:"catch_up_seconds"`
	CatchUpPolicy       string          `json:"catch_up_policy"`
	Overlap             string          `json:"overlap"`
	JitterSeconds       float64         `json:"jitter_seconds"`
	DeadlineSeconds     float64         `json:"deadline_seconds"`
	StartsAt            *string         `json:"starts_at"`
	EndsAt              *string         `json:"ends_at"`
	Version             int64           `json:"version"`
	State               string          `json:"state"`
	PausedAt            *string         `json:"paused_at"`
	PausedBy            *string         `json:"paused_by"`
	PausedNote          *string         `json:"paused_note"`
	NextTick            *string         `json:"next_tick"`
	DueAt               *string         `json:"due_at"`
	CreatedAt           *string         `json:"created_at"`
	UpdatedAt           *string         `json:"updated_at"`
	UpdatedBy           string          `json:"updated_by"`
	LastStartedAt       *string         `json:"last_started_at"`
	LastSuccessAt       *string         `json:"last_success_at"`
	LastFailureAt       *string         `json:"last_failure_at"`
	LastError           *string         `json:"last_error"`
	ConsecutiveFailures int             `json:"consecutive_failures"`
	DBNow               *string         `json:"db_now"`
}

// scheduleGetJSON is `schedules get --json`: the schedule and its next fire times.
type scheduleGetJSON struct {
	scheduleJSON
	NextTicks []tickJSON `json:"next_ticks"`
}

// tickJSON is a fire time in the schedule's zone and in UTC.
type tickJSON struct {
	Local string `json:"local"`
	UTC   string `json:"utc"`
}

func toScheduleJSON(i schedules.Info) scheduleJSON {
	return scheduleJSON{Name: i.Name, Expr: i.Expr, Zone: i.Zone, Handler: i.Handler, Args: i.Args,
		CatchUpSeconds: i.CatchUp.Seconds(), CatchUpPolicy: string(i.CatchUpPolicy), Overlap: overlapName(i.Overlap),
		JitterSeconds: i.Jitter.Seconds(), DeadlineSeconds: i.Deadline.Seconds(),
		StartsAt: jsonTime(i.StartsAt), EndsAt: jsonTime(i.EndsAt), Version: i.Version, State: scheduleState(i),
		PausedAt: jsonTime(i.PausedAt), PausedBy: nullString(i.PausedBy), PausedNote: nullString(i.PausedNote),
		NextTick: jsonTime(i.NextTick), DueAt: jsonTime(i.DueAt), CreatedAt: jsonTime(i.CreatedAt),
		UpdatedAt: jsonTime(i.UpdatedAt), UpdatedBy: i.UpdatedBy, LastStartedAt: jsonTime(i.LastStartedAt),
		LastSuccessAt: jsonTime(i.LastSuccessAt), LastFailureAt: jsonTime(i.LastFailureAt),
		LastError: nullString(i.LastError), ConsecutiveFailures: i.ConsecutiveFailures, DBNow: jsonTime(i.DBNow)}
}

// overlapNames are the CLI's names of the overlap policies (--overlap and the output).
var overlapNames = map[string]schedules.Overlap{
	"skip": schedules.OverlapSkip, "buffer": schedules.OverlapBuffer,
	"allow": schedules.OverlapAllow, "replace": schedules.OverlapReplace,
}

// overlapName is the CLI's name of an overlap policy.
func overlapName(o schedules.Overlap) string {
	for name, v := range overlapNames {
		if v == o {
			return name
		}
	}
	return string(o)
}

func scheduleState(i schedules.Info) string {
	if i.Paused {
		return "paused"
	}
	return "active"
}

// zoned formats t in zone and in UTC: "2027-01-04 09:00:00 CET (08:00:00Z)", or
// "2027-01-04T08:00:00Z" alone when zone is UTC; "-" for the zero time.
func zoned(t time.Time, zone string) string {
	if t.IsZero() {
		return "-"
	}
	utc := t.UTC().Format(time.RFC3339)
	loc, err := time.LoadLocation(zone)
	if err != nil || loc == time.UTC {
		return utc
	}
	return t.In(loc).Format("2006-01-02 15:04:05 MST") + " (" + utc + ")"
}

func (a *app) schedulesListCommand() *cobra.Command {
	var (
		limit int
		lf    listFlags
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the schedules in name order: expression, zone, handler, state, next tick",
		Long: `List the schedules in name order: expression, time zone, handler, state (active or paused)
and the next tick, in the schedule's zone and in UTC ("-" while a change is being applied,
or when no tick is left). At most --limit schedules are shown (a note on stderr says when
there are more).

With --json: an array ([] when empty) of {"name", "expr", "zone", "handler", "args",
"catch_up_seconds", "catch_up_policy", "overlap", "jitter_seconds", "deadline_seconds",
"starts_at", "ends_at", "version", "state", "paused_at", "paused_by", "paused_note",
"next_tick", "due_at", "created_at", "updated_at", "updated_by", "last_started_at",
"last_success_at", "last_failure_at", "last_error", "consecutive_failures", "db_now"}.`,
		Example: `  pgcoord schedules ls
  pgcoord schedules ls --prefix report- --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error { return a.printSchedules(ctx, pool, lf.prefix, limit) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many schedules")
	addListFlags(cmd, &lf, "only schedules whose name starts with this")
	return cmd
}

// printSchedules reads at most limit schedules whose name starts with prefix and prints them.
func (a *app) printSchedules(ctx context.Context, pool *pgxpool.Pool, prefix string, limit int) error {
	all, more, err := page.Collect(limit, schedules.MaxListLimit, func(last *schedules.Info, n int) ([]schedules.Info, error) {
		opts := schedules.ListOpts{Prefix: prefix, Limit: n}
		if last != nil {
			opts.After = last.Name
		}
		return schedules.List(ctx, pool, &opts)
	})
	if err != nil {
		return argError(err)
	}
	if more {
		fmt.Fprintf(a.errOut, "pgcoord: showing the first %d schedules; there are more (raise --limit, or narrow --prefix)\n", limit)
	}
	if a.json {
		js := make([]scheduleJSON, 0, len(all))
		for _, i := range all {
			js = append(js, toScheduleJSON(i))
		}
		return a.printJSON(js)
	}
	if len(all) == 0 {
		fmt.Fprintln(a.out, "no schedules ('pgcoord schedules create' creates one)")
		return nil
	}
	tw := a.table()
	fmt.Fprintln(tw, "NAME\tEXPR\tZONE\tHANDLER\tSTATE\tNEXT")
	for _, i := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", i.Name, i.Expr, i.Zone, i.Handler, scheduleState(i), zoned(i.NextTick, i.Zone))
	}
	return tw.Flush()
}

func (a *app) schedulesGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a schedule: its definition, state, next five fire times and last outcomes",
		Long: `Show the schedule NAME: its definition, its state, its next five fire times after the
database's now (in the schedule's zone and in UTC) and the outcomes of its runs. An unknown
schedule is an error (exit 1).

With --json: the object of 'schedules list --json' with "next_ticks", an array of
{"local", "utc"}.`,
		Example: `  pgcoord schedules get weekly-report
  pgcoord schedules get weekly-report --json`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			i, err := schedules.Get(ctx, pool, args[0])
			if err != nil {
				return argError(err)
			}
			next, err := schedules.NextTicks(i.Schedule, i.DBNow, nextTicksShown)
			if err != nil {
				return err
			}
			if a.json {
				js := scheduleGetJSON{scheduleJSON: toScheduleJSON(i), NextTicks: make([]tickJSON, 0, len(next))}
				for _, t := range next {
					js.NextTicks = append(js.NextTicks, tickJSON{Local: localTime(t, i.Zone), UTC: rfc3339(t)})
				}
				return a.printJSON(js)
			}
			a.printSchedule(i, next)
			return nil
		},
	}
}

// localTime is t in zone as RFC 3339 with its offset.
func localTime(t time.Time, zone string) string {
	if loc, err := time.LoadLocation(zone); err == nil {
		t = t.In(loc)
	}
	return t.Format(time.RFC3339)
}

// printSchedule prints a schedule as `schedules get` shows it.
func (a *app) printSchedule(i schedules.Info, next []time.Time) {
	state := scheduleState(i)
	if i.Paused {
		state = fmt.Sprintf("paused at %s by %s", preciseTime(i.PausedAt), dash(i.PausedBy))
		if i.PausedNote != "" {
			state += ": " + i.PausedNote
		}
	}
	rows := [][2]string{
		{"schedule", i.Name},
		{"expr", i.Expr},
		{"zone", i.Zone},
		{"handler", i.Handler},
		{"args", string(i.Args)},
		{"catch-up", fmt.Sprintf("%s, %s", compactDuration(i.CatchUp), i.CatchUpPolicy)},
		{"overlap", overlapName(i.Overlap)},
		{"jitter", compactDuration(i.Jitter)},
		{"deadline", durationOrNone(i.Deadline)},
		{"starts at", zoned(i.StartsAt, i.Zone)},
		{"ends at", zoned(i.EndsAt, i.Zone)},
		{"state", state},
		{"version", strconv.FormatInt(i.Version, 10)},
		{"updated", fmt.Sprintf("%s by %s", preciseTime(i.UpdatedAt), dash(i.UpdatedBy))},
	}
	for n, t := range next {
		rows = append(rows, [2]string{fmt.Sprintf("next %d", n+1), zoned(t, i.Zone)})
	}
	if len(next) == 0 {
		rows = append(rows, [2]string{"next", "- (no tick left)"})
	}
	rows = append(rows,
		[2]string{"last started", preciseTime(i.LastStartedAt)},
		[2]string{"last success", preciseTime(i.LastSuccessAt)},
		[2]string{"last failure", preciseTime(i.LastFailureAt)},
		[2]string{"last error", dash(oneLine(i.LastError, 200))},
		[2]string{"failures in a row", strconv.Itoa(i.ConsecutiveFailures)},
	)
	a.printFields(rows)
}

// durationOrNone is d for people, "none" when zero.
func durationOrNone(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return compactDuration(d)
}
