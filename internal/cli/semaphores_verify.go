package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/semaphore"
)

// semCheckJSON is one key in `semaphores verify --json`.
type semCheckJSON struct {
	Key       string   `json:"key"`
	Status    string   `json:"status"` // ok, over_limit or leaked (over_limit wins when both apply)
	Limit     int      `json:"limit"`
	Held      int      `json:"held"`
	Expired   int      `json:"expired"`
	OverLimit bool     `json:"over_limit"`
	Leaked    bool     `json:"leaked"`
	Problems  []string `json:"problems"`
}

// judgeSemaphore applies the check of `semaphores verify` to one key.
func judgeSemaphore(s semaphore.KeyStatus) semCheckJSON {
	c := semCheckJSON{Key: s.Key, Status: semStatus(s), Limit: s.Limit, Held: s.Held, Expired: s.Expired,
		OverLimit: s.OverLimit(), Leaked: s.Expired > 0, Problems: []string{}}
	if c.OverLimit {
		c.Problems = append(c.Problems, fmt.Sprintf("holds %d permits, more than its limit of %d "+
			"(expected right after the limit was lowered, until permits are released or expire)", s.Held, s.Limit))
	}
	if c.Leaked {
		c.Problems = append(c.Problems, fmt.Sprintf("%d permit(s) past expiry, never released: leaked slots of holders "+
			"that died or stopped renewing (reclaimed by the key's next admission; 'pgcoord semaphores show %s' lists them)", s.Expired, s.Key))
	}
	return c
}

func (a *app) semaphoresVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Exit 3 if any semaphore key holds more than its limit or holds permits past expiry",
		Long: `Check every semaphore key and exit 3 if any needs attention, saying which and why:

  over_limit  it holds more unexpired permits than its limit. Expected right after its
              limit was lowered ('semaphores set-limit': nothing is revoked), until
              permits are released or expire; otherwise a bug worth reporting.
  leaked      it holds permits past their expiry that nobody released: a holder died,
              or ran longer than its TTL without renewing (and may still be working,
              without its slot). They are reclaimed by the key's next admission.

Exit 0 when every key is healthy (also when there are no keys).

With --json: an array ([] when there are no keys) of {"key", "status", "limit", "held",
"expired", "over_limit", "leaked", "problems"} for every key, and the same exit code.`,
		Example: `  pgcoord semaphores verify
  pgcoord semaphores verify --json | jq '.[] | select(.status != "ok")'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			keys, _, err := listSemaphores(ctx, pool, -1, "")
			if err != nil {
				return err
			}
			results := make([]semCheckJSON, 0, len(keys))
			bad, over := 0, 0
			for _, s := range keys {
				c := judgeSemaphore(s)
				if c.Status != semOK {
					bad++
				}
				if c.OverLimit {
					over++
				}
				results = append(results, c)
			}
			if a.json {
				if err := a.printJSON(results); err != nil {
					return err
				}
			} else {
				for _, c := range results {
					if c.Status != semOK {
						fmt.Fprintf(a.out, "%s %s: %s\n", strings.ToUpper(strings.ReplaceAll(c.Status, "_", "-")), base.Printable(c.Key), base.Printable(strings.Join(c.Problems, "; ")))
					}
				}
			}
			if bad > 0 {
				if over > 0 {
					fmt.Fprintln(a.errOut, "pgcoord: note: a key over its limit right after its limit was lowered is expected until its permits drain")
				}
				fmt.Fprintf(a.errOut, "pgcoord: %d of %d semaphore keys need attention\n", bad, len(results))
				return errCheckFailed
			}
			if !a.json {
				fmt.Fprintf(a.out, "all %d semaphore keys healthy: none over its limit, no permit past expiry\n", len(results))
			}
			return nil
		},
	}
}
