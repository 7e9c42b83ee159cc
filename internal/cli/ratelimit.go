package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/ratelimit"
)

func (a *app) ratelimitCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ratelimit",
		Short: "Operate rate limits: list, get, set and delete policies, reset a key",
		Long: `Operate pgcoord's rate limits (package ratelimit): policies of RATE units per PERIOD in
bursts of up to BURST, judged per key by the generic cell rate algorithm on the database
clock. A change applies from the next call, with no restart. Changes are audited.`,
	}
	cmd.AddCommand(a.ratelimitListCommand(), a.ratelimitGetCommand(), a.ratelimitSetCommand(),
		a.ratelimitDeleteCommand(), a.ratelimitResetCommand())
	return cmd
}

// ratelimitPolicyJSON is a policy in `ratelimit list --json` and `get --json`.
type ratelimitPolicyJSON struct {
	Name          string  `json:"name"`
	Rate          int64   `json:"rate"`
	PeriodSeconds float64 `json:"period_seconds"`
	Burst         int64   `json:"burst"`
	Shadow        bool    `json:"shadow"`
	Unlogged      bool    `json:"unlogged"`
	IntervalUS    int64   `json:"interval_us"`
	ShadowRefused int64   `json:"shadow_refused"`
	UpdatedAt     *string `json:"updated_at"`
}

func toRatelimitJSON(p ratelimit.Policy) ratelimitPolicyJSON {
	return ratelimitPolicyJSON{Name: p.Name, Rate: p.Rate, PeriodSeconds: p.Period.Seconds(), Burst: p.Burst,
		Shadow: p.Shadow, Unlogged: p.Unlogged, IntervalUS: p.Interval.Microseconds(), ShadowRefused: p.ShadowRefused,
		UpdatedAt: jsonTime(p.UpdatedAt)}
}

// ratelimitMode says whether p enforces or shadows, and whether its keys are unlogged.
func ratelimitMode(p ratelimit.Policy) string {
	mode := "enforce"
	if p.Shadow {
		mode = "shadow"
	}
	if p.Unlogged {
		mode += ", unlogged"
	}
	return mode
}

func (a *app) ratelimitListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the rate limit policies",
		Long: `List every rate limit policy: its rate, burst, mode (enforce or shadow) and, in shadow mode,
the calls it would have refused since shadow mode was turned on.

With --json: an array of {"name", "rate", "period_seconds", "burst", "shadow", "unlogged", "interval_us",
"shadow_refused", "updated_at"}.`,
		Example: `  pgcoord ratelimit list
  pgcoord ratelimit list --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			ps, err := ratelimit.List(ctx, pool, &ratelimit.ListOpts{Limit: pgcoord.MaxListLimit})
			if err != nil {
				return err
			}
			if a.json {
				out := make([]ratelimitPolicyJSON, len(ps))
				for i, p := range ps {
					out[i] = toRatelimitJSON(p)
				}
				return a.printJSON(out)
			}
			if len(ps) == 0 {
				fmt.Fprintln(a.out, "no rate limit policies ('pgcoord ratelimit set' creates one)")
				return nil
			}
			tw := a.table()
			fmt.Fprintln(tw, "POLICY\tRATE\tBURST\tMODE\tSHADOW REFUSED")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%s\t%s\n", p.Name, p.Rate, compactDuration(p.Period), p.Burst,
					ratelimitMode(p), shadowCount(p))
			}
			return tw.Flush()
		},
	}
}

func shadowCount(p ratelimit.Policy) string {
	if !p.Shadow {
		return "-"
	}
	return strconv.FormatInt(p.ShadowRefused, 10)
}

// ratelimitKeyJSON is `ratelimit get POLICY KEY --json`.
type ratelimitKeyJSON struct {
	Policy            string  `json:"policy"`
	Key               string  `json:"key"`
	Remaining         int64   `json:"remaining"`
	ResetAfterSeconds float64 `json:"reset_after_seconds"`
}

func (a *app) ratelimitGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get POLICY [KEY]",
		Short: "Show a policy, or a key's state under it (remaining units, time to reset)",
		Long: `Show the policy POLICY or, with KEY, the key's state under it, judged now by the database
clock without charging it: the units it admits now and how long until it is at rest (a full
burst). A key never charged, or at rest, has a full burst. An unknown policy is an error
(exit 1).

With --json: the policy as in 'ratelimit list --json', or {"policy", "key", "remaining",
"reset_after_seconds"}.`,
		Example: `  pgcoord ratelimit get api
  pgcoord ratelimit get api key:123`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("%s takes POLICY and an optional KEY, got %d argument(s)", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if len(args) == 1 {
				p, err := ratelimit.Get(ctx, pool, args[0])
				if err != nil {
					return argError(err)
				}
				if a.json {
					return a.printJSON(toRatelimitJSON(p))
				}
				a.printFields([][2]string{
					{"policy", p.Name},
					{"rate", fmt.Sprintf("%d per %s (one unit every %s)", p.Rate, compactDuration(p.Period), p.Interval)},
					{"burst", strconv.FormatInt(p.Burst, 10)},
					{"mode", ratelimitMode(p)},
					{"shadow refused", shadowCount(p)},
					{"updated", preciseTime(p.UpdatedAt)},
				})
				return nil
			}
			st, err := ratelimit.State(ctx, pool, ratelimit.Limit{Policy: args[0], Key: args[1]})
			if err != nil {
				return argError(err)
			}
			if a.json {
				return a.printJSON(ratelimitKeyJSON{Policy: st.Policy, Key: st.Key, Remaining: st.Remaining,
					ResetAfterSeconds: st.ResetAfter.Seconds()})
			}
			a.printFields([][2]string{
				{"policy", st.Policy},
				{"key", st.Key},
				{"remaining", strconv.FormatInt(st.Remaining, 10)},
				{"reset after", st.ResetAfter.Round(time.Millisecond).String()},
			})
			return nil
		},
	}
}

func (a *app) ratelimitSetCommand() *cobra.Command {
	var (
		rate, burst int64
		period      time.Duration
		shadow      bool
		unlogged    bool
	)
	cmd := &cobra.Command{
		Use:   "set NAME --rate N --period D --burst B [--shadow] [--unlogged]",
		Short: "Create or change a rate limit policy (applies from the next call)",
		Long: `Create the policy NAME, or change it: --rate units per --period, in bursts of up to --burst.
The change applies from every process's next call; keys keep their state. --shadow makes
the policy count the calls it would refuse and refuse none (for rolling out a new limit);
set it again without --shadow to enforce it. --unlogged, when the policy is created, keeps its
keys in an UNLOGGED table: faster (no WAL flush per call), but a crash of the server or a
failover puts every key at rest again (a full burst); it cannot change afterwards (delete
the policy and create it again). Audited.

With --json: the policy afterwards, as in 'ratelimit list --json'.`,
		Example: `  pgcoord ratelimit set api --rate 10 --period 1s --burst 20
  pgcoord ratelimit set tenant --rate 1000 --period 1m --burst 100 --shadow`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			for _, f := range []string{"rate", "period", "burst"} {
				if !cmd.Flags().Changed(f) {
					return usagef("--%s is required", f)
				}
			}
			switch {
			case rate < 1 || rate > ratelimit.MaxRate:
				return usagef("--rate %d: want 1 to %d", rate, ratelimit.MaxRate)
			case period < time.Microsecond || period > ratelimit.MaxPeriod || period%time.Microsecond != 0:
				return usagef("--period %v: want whole microseconds from 1µs to %s", period, compactDuration(ratelimit.MaxPeriod))
			case burst < 1 || burst > ratelimit.MaxBurst:
				return usagef("--burst %d: want 1 to %d", burst, ratelimit.MaxBurst)
			}
			p := ratelimit.Policy{Name: args[0], Rate: rate, Period: period, Burst: burst, Shadow: shadow, Unlogged: unlogged}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var got ratelimit.Policy
			err = a.audited(ctx, pool, "ratelimit.set", p.Name, func(tx pgx.Tx) (map[string]any, error) {
				got, err = ratelimit.Set(ctx, tx, p)
				return map[string]any{"rate": rate, "period": period.String(), "burst": burst, "shadow": shadow, "unlogged": unlogged}, err
			})
			if err != nil {
				return argError(err)
			}
			if a.json {
				return a.printJSON(toRatelimitJSON(got))
			}
			fmt.Fprintf(a.out, "policy %q: %d per %s, burst %d, %s (one unit every %s)\n",
				got.Name, got.Rate, compactDuration(got.Period), got.Burst, ratelimitMode(got), got.Interval)
			return nil
		},
	}
	f := cmd.Flags()
	f.Int64Var(&rate, "rate", 0, fmt.Sprintf("units admitted per --period (1 to %d)", ratelimit.MaxRate))
	f.DurationVar(&period, "period", 0, "the period of --rate (1µs to 366 days, e.g. 1s, 1m, 24h)")
	f.Int64Var(&burst, "burst", 0, fmt.Sprintf("the most units admitted at once (1 to %d)", ratelimit.MaxBurst))
	f.BoolVar(&shadow, "shadow", false, "count the calls it would refuse, refuse none")
	f.BoolVar(&unlogged, "unlogged", false, "keep the keys in an UNLOGGED table (lost at a crash or failover); only when creating")
	return cmd
}

func (a *app) ratelimitDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a rate limit policy and its keys' state",
		Long: `Delete the policy NAME and its keys' state. Calls that name it fail from then on
(ratelimit.ErrUnknownPolicy). A policy that does not exist is an error (exit 1). Audited.`,
		Example: `  pgcoord ratelimit delete api`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var deleted bool
			err = a.audited(ctx, pool, "ratelimit.delete", args[0], func(tx pgx.Tx) (map[string]any, error) {
				deleted, err = ratelimit.Delete(ctx, tx, args[0])
				if err == nil && !deleted {
					err = fmt.Errorf("%w: %q", ratelimit.ErrUnknownPolicy, args[0])
				}
				return nil, err
			})
			if err != nil {
				return argError(err)
			}
			fmt.Fprintf(a.out, "policy %q deleted\n", args[0])
			return nil
		},
	}
}

func (a *app) ratelimitResetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "reset POLICY KEY",
		Short: "Give a key its full burst back (operator action)",
		Long: `Forget KEY's state under POLICY: it is at rest again, with a full burst. A key with no state
is left as it is (exit 0). Audited.`,
		Example: `  pgcoord ratelimit reset api key:123`,
		Args:    exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			l := ratelimit.Limit{Policy: args[0], Key: args[1]}
			if _, err := ratelimit.Get(ctx, pool, l.Policy); err != nil {
				return argError(err)
			}
			var had bool
			err = a.audited(ctx, pool, "ratelimit.reset", l.Policy+" "+l.Key, func(tx pgx.Tx) (map[string]any, error) {
				had, err = ratelimit.Reset(ctx, tx, l)
				return map[string]any{"key": l.Key, "had_state": had}, err
			})
			if err != nil {
				return argError(err)
			}
			if had {
				fmt.Fprintf(a.out, "key %q of policy %q reset: a full burst again\n", l.Key, l.Policy)
			} else {
				fmt.Fprintf(a.out, "key %q of policy %q had no state: it already had a full burst\n", l.Key, l.Policy)
			}
			return nil
		},
	}
}
