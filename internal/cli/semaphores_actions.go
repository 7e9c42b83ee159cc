package cli

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/semaphore"
)

// semMaxWeight is the largest weight a semaphore key may have (the CHECK of
// pgcoord_semaphores.weight).
const semMaxWeight = 1_000_000

func (a *app) semaphoresSetLimitCommand() *cobra.Command {
	var weight int
	cmd := &cobra.Command{
		Use:   "set-limit KEY LIMIT",
		Short: "Set the limit (and --weight) of a semaphore key, creating it if needed",
		Long: `Set the most permits KEY may hold at once to LIMIT (at least 1), and with --weight its
weight in fair admission across keys (1 to 1000000; unchanged when not given, 1 for a new
key). The key is created if it does not exist.

Raising the limit wakes waiters at once. Lowering it revokes nothing: permits already held
stay valid until released or expired, new admissions wait until fewer than the new limit
are held — so right after lowering, HELD may exceed LIMIT (and 'semaphores verify' says so)
until permits drain. 'semaphores drain' revokes them now.

With --json: the key afterwards, as in 'semaphores list --json'.`,
		Example: `  pgcoord semaphores set-limit tenant:42 8
  pgcoord semaphores set-limit tenant:42 8 --weight 3`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			key := args[0]
			if err := semKeyArg(key); err != nil {
				return err
			}
			limit, err := strconv.Atoi(args[1])
			if err != nil || limit < 1 {
				return usagef("limit %q: want an integer of at least 1", args[1])
			}
			weightSet := cmd.Flags().Changed("weight")
			if weightSet && (weight < 1 || weight > semMaxWeight) {
				return usagef("--weight %d: want 1 to %d", weight, semMaxWeight)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var opts *semaphore.SetLimitOpts
			if weightSet {
				opts = &semaphore.SetLimitOpts{Weight: weight}
			}
			err = a.audited(ctx, pool, "semaphore.set_limit", key, func(tx pgx.Tx) (map[string]any, error) {
				d := map[string]any{"limit": limit}
				if weightSet {
					d["weight"] = weight
				}
				return d, semaphore.SetLimit(ctx, tx, key, limit, opts)
			})
			if err != nil {
				return argError(err)
			}
			s, err := getSemaphore(ctx, pool, key)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(toSemKeyJSON(s))
			}
			fmt.Fprintf(a.out, "semaphore %q: limit %d, weight %d; %d permits held\n", key, s.Limit, s.Weight, s.Held)
			if s.Held > s.Limit {
				fmt.Fprintf(a.out, "%d permits are held, more than the new limit: nothing was revoked; new admissions wait until fewer than %d are held ('pgcoord semaphores drain %s' revokes them now)\n",
					s.Held, s.Limit, key)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&weight, "weight", 0, "weight in fair admission across keys, 1 to 1000000 (default: unchanged; 1 for a new key)")
	return cmd
}

// semDrainPermitJSON is one permit in `semaphores drain --json`.
type semDrainPermitJSON struct {
	Holder     string  `json:"holder"`
	FenceToken int64   `json:"fence_token"`
	AcquiredAt *string `json:"acquired_at"`
	ExpiresAt  *string `json:"expires_at"`
}

// semDrainJSON is the --json output of `semaphores drain`.
type semDrainJSON struct {
	Key         string               `json:"key"`
	DryRun      bool                 `json:"dry_run"`
	Revoked     *int                 `json:"revoked"`      // null with --dry-run
	WouldRevoke *int                 `json:"would_revoke"` // null without --dry-run
	Permits     []semDrainPermitJSON `json:"permits"`
}

func (a *app) semaphoresDrainCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "drain KEY",
		Short: "Revoke every permit of a semaphore key now (operator action); --dry-run shows what it would do",
		Long: `Revoke every permit of KEY at once, whoever holds it (semaphore.Drain): the slots are free
for new admissions and waiters are woken. The holders are not told: their renewals and
releases fail from then on (semaphore.ErrLost), and their fence tokens are stale — every
later admission to KEY gets a higher token, so fenced writes reject the old holders. A
holder still working keeps working without its slot until it next renews: drain is for
wedged or runaway holders, or to apply a lowered limit now.

It prints the revoked permits. A key that does not exist is an error (exit 1); a key with
no permits revokes nothing (exit 0).

--dry-run lists the permits that would be revoked and changes nothing. With --json:
{"key", "dry_run", "revoked", "would_revoke", "permits"}, where permits ([] when none)
have the keys holder, fence_token, acquired_at, expires_at.`,
		Example: `  pgcoord semaphores drain tenant:42 --dry-run
  pgcoord semaphores drain tenant:42`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			key := args[0]
			if err := semKeyArg(key); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if _, err := getSemaphore(ctx, pool, key); err != nil {
				return err
			}
			var permits []semaphore.Permit
			if dryRun {
				infos, err := semPermits(ctx, pool, key)
				if err != nil {
					return err
				}
				for _, p := range infos {
					permits = append(permits, p.Permit)
				}
			} else {
				err = a.audited(ctx, pool, "semaphore.drain", key, func(tx pgx.Tx) (map[string]any, error) {
					permits, err = semaphore.Drain(ctx, tx, key)
					if errors.Is(err, semaphore.ErrNotFound) {
						permits, err = nil, nil // the key exists: nothing to revoke
					}
					return map[string]any{"revoked": len(permits)}, err
				})
				if err != nil {
					return argError(err)
				}
			}

			n := len(permits)
			var maxToken int64
			for _, p := range permits {
				maxToken = max(maxToken, p.Token)
			}
			if a.json {
				js := semDrainJSON{Key: key, DryRun: dryRun, Permits: make([]semDrainPermitJSON, 0, n)}
				if dryRun {
					js.WouldRevoke = &n
				} else {
					js.Revoked = &n
				}
				for _, p := range permits {
					js.Permits = append(js.Permits, semDrainPermitJSON{Holder: p.Holder, FenceToken: p.Token,
						AcquiredAt: jsonTime(p.AcquiredAt), ExpiresAt: jsonTime(p.ExpiresAt)})
				}
				return a.printJSON(js)
			}
			if n == 0 {
				if dryRun {
					fmt.Fprintf(a.out, "semaphore %q holds no permits: nothing would be revoked (--dry-run: nothing changed)\n", key)
				} else {
					fmt.Fprintf(a.out, "semaphore %q held no permits: nothing revoked\n", key)
				}
				return nil
			}
			if dryRun {
				fmt.Fprintf(a.out, "would revoke %d permit(s) of semaphore %q:\n", n, key)
			} else {
				fmt.Fprintf(a.out, "revoked %d permit(s) of semaphore %q:\n", n, key)
			}
			tw := a.table()
			fmt.Fprintln(tw, "HOLDER\tTOKEN\tACQUIRED\tEXPIRES")
			for _, p := range permits {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", p.Holder, p.Token, preciseTime(p.AcquiredAt), preciseTime(p.ExpiresAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if dryRun {
				fmt.Fprintln(a.out, "nothing changed (--dry-run)")
				return nil
			}
			fmt.Fprintf(a.out, "their holders' renewals and releases now fail, and their fence tokens (up to %d) are stale: "+
				"every later admission gets a higher token\n", maxToken)
			return nil
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list the permits that would be revoked, change nothing")
	return cmd
}
