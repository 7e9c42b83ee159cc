package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgcoord/pgcoord/schedules"
)

// scheduleFlags are the definition flags of `schedules create` and `update`.
type scheduleFlags struct {
	expr, zone, handler, args, policy, overlap, startsAt, endsAt string
	catchUp, jitter, deadline                                    time.Duration
	own                                                          *pflag.FlagSet // the flags above
}

// add defines the flags on f.
func (s *scheduleFlags) add(f *pflag.FlagSet) {
	s.own = pflag.NewFlagSet("schedule", pflag.ContinueOnError)
	defer f.AddFlagSet(s.own)
	f = s.own
	f.StringVar(&s.expr, "expr", "", `cron expression: five fields, six with seconds first, @daily and the like, or "@every 5m"`)
	f.StringVar(&s.zone, "zone", schedules.DefaultZone, "IANA time zone the expression is read in")
	f.StringVar(&s.handler, "handler", "", "the handler that runs the ticks (registered by a Scheduler)")
	f.StringVar(&s.args, "args", "{}", "JSON the handler receives with each run")
	f.DurationVar(&s.catchUp, "catch-up", schedules.DefaultCatchUp, "catch-up window: a tick claimed later than this after it was due is recorded missed (1s to 366d)")
	f.StringVar(&s.policy, "catch-up-policy", string(schedules.CatchUpLatest), "which due ticks within the window run: latest or all")
	f.StringVar(&s.overlap, "overlap", "skip", "a tick due while a run still runs: skip, buffer, allow or replace")
	f.DurationVar(&s.jitter, "jitter", 0, "delay each tick's claim by up to this (at most 24h)")
	f.DurationVar(&s.deadline, "deadline", 0, "cancel a run after this (0: none; at most 24h)")
	f.StringVar(&s.startsAt, "starts-at", "", `no tick before this time (RFC 3339; "" for none)`)
	f.StringVar(&s.endsAt, "ends-at", "", `no tick after this time (RFC 3339; "" for none)`)
}

// apply sets the fields of s whose flags were given on the command line, checking the
// flags the API cannot (JSON, policy names, times). The API checks the rest before SQL.
func (s *scheduleFlags) apply(f *pflag.FlagSet, d *schedules.Schedule) error {
	set := func(name string, do func() error) error {
		if !f.Changed(name) {
			return nil
		}
		return do()
	}
	return errors.Join(
		set("expr", func() error { d.Expr = s.expr; return nil }),
		set("zone", func() error { d.Zone = s.zone; return nil }),
		set("handler", func() error { d.Handler = s.handler; return nil }),
		set("args", func() error {
			if !json.Valid([]byte(s.args)) {
				return usagef("--args %q is not valid JSON", s.args)
			}
			d.Args = json.RawMessage(s.args)
			return nil
		}),
		set("catch-up", func() error { d.CatchUp = s.catchUp; return nil }),
		set("catch-up-policy", func() error {
			p := schedules.CatchUpPolicy(s.policy)
			if p != schedules.CatchUpLatest && p != schedules.CatchUpAll {
				return usagef("--catch-up-policy %q: want latest or all", s.policy)
			}
			d.CatchUpPolicy = p
			return nil
		}),
		set("overlap", func() error {
			o, ok := overlapNames[s.overlap]
			if !ok {
				return usagef("--overlap %q: want skip, buffer, allow or replace", s.overlap)
			}
			d.Overlap = o
			return nil
		}),
		set("jitter", func() error { d.Jitter = s.jitter; return nil }),
		set("deadline", func() error { d.Deadline = s.deadline; return nil }),
		set("starts-at", func() (err error) { d.StartsAt, err = timeFlag("starts-at", s.startsAt); return err }),
		set("ends-at", func() (err error) { d.EndsAt, err = timeFlag("ends-at", s.endsAt); return err }),
	)
}

// timeFlag parses an RFC 3339 flag; "" is the zero time.
func timeFlag(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, usagef("--%s %q: want an RFC 3339 time such as 2027-01-04T09:00:00+01:00", name, v)
	}
	return t, nil
}

// changeOpts are the options of a change: the actor of the audit log.
func (a *app) changeOpts() *schedules.ChangeOpts {
	return &schedules.ChangeOpts{Actor: a.actorName()}
}

// printChanged prints a schedule after a change: as `get --json` prints it, or a line.
func (a *app) printChanged(i schedules.Info, verb string) error {
	if a.json {
		return a.printJSON(toScheduleJSON(i))
	}
	fmt.Fprintf(a.out, "schedule %q %s: %q in %s, handler %q, %s, version %d, next tick %s\n",
		i.Name, verb, i.Expr, i.Zone, i.Handler, scheduleState(i), i.Version, zoned(i.NextTick, i.Zone))
	return nil
}

func (a *app) schedulesCreateCommand() *cobra.Command {
	var sf scheduleFlags
	cmd := &cobra.Command{
		Use:   "create NAME --expr E --handler H [flags]",
		Short: "Create a schedule (armed at once)",
		Long: `Create the schedule NAME: ticks of --expr read in --zone, run by a Scheduler that registered
--handler, with --args. The definition is checked before anything is written: a bad
expression (the error names the field and column), an unknown zone, an --ends-at not after
--starts-at or a bad flag exits 2. A name taken by a schedule or a job exits 1. Audited.

With --json: the schedule, as in 'schedules list --json'.`,
		Example: `  pgcoord schedules create weekly-report --expr "0 9 * * MON-FRI" --zone Europe/Berlin --handler report
  pgcoord schedules create sync --expr "@every 5m" --handler sync --overlap buffer --args '{"full":false}'`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, f := range []string{"expr", "handler"} {
				if !cmd.Flags().Changed(f) {
					return usagef("--%s is required", f)
				}
			}
			s := schedules.Schedule{Name: args[0]}
			if err := sf.apply(cmd.Flags(), &s); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			i, err := schedules.Create(ctx, pool, s, a.changeOpts())
			if err != nil {
				return argError(err)
			}
			return a.printChanged(i, "created")
		},
	}
	sf.add(cmd.Flags())
	return cmd
}

func (a *app) schedulesUpdateCommand() *cobra.Command {
	var sf scheduleFlags
	cmd := &cobra.Command{
		Use:   "update NAME [flags]",
		Short: "Change the flags given of a schedule (applies from the next tick)",
		Long: `Change the schedule NAME: the flags given replace those fields, the others stay. The
schedule is read, changed and written only if nobody changed it in between: a concurrent
change is refused (exit 1; read it again and retry). The change applies from the first
tick after it. Bad flags exit 2 as for 'create'. Audited.

With --json: the schedule afterwards, as in 'schedules list --json'.`,
		Example: `  pgcoord schedules update weekly-report --expr "0 8 * * MON-FRI"
  pgcoord schedules update sync --ends-at ""`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !sf.anyChanged() {
				return usagef("nothing to change: give at least one of --expr, --zone, --handler, --args, --catch-up, ...")
			}
			var probe schedules.Schedule
			if err := sf.apply(cmd.Flags(), &probe); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			cur, err := schedules.Get(ctx, pool, args[0])
			if err != nil {
				return argError(err)
			}
			s := cur.Schedule
			if err := sf.apply(cmd.Flags(), &s); err != nil {
				return err
			}
			o := a.changeOpts()
			i, err := schedules.Update(ctx, pool, s, &schedules.UpdateOpts{Actor: o.Actor, Version: cur.Version})
			if errors.Is(err, schedules.ErrChanged) {
				return fmt.Errorf("schedule %q changed while it was being updated (read at version %d): nothing written; read it again and retry", args[0], cur.Version)
			}
			if err != nil {
				return argError(err)
			}
			return a.printChanged(i, "updated")
		},
	}
	sf.add(cmd.Flags())
	return cmd
}

// anyChanged reports whether one of the definition flags was given.
func (s *scheduleFlags) anyChanged() bool {
	changed := false
	s.own.VisitAll(func(fl *pflag.Flag) { changed = changed || fl.Changed })
	return changed
}
