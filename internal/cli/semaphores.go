package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// semMaxWeight is the largest weight a semaphore key may have (the CHECK of
// pgcoord_semaphores.weight).
const semMaxWeight = 1_000_000

// semPageSize is how many keys one semaphore.List call reads.
const semPageSize = 1000

// Verdicts of `semaphores verify`, per key.
const (
	semOK        = "ok"         // at most its limit held, no permit past expiry
	semOverLimit = "over_limit" // more permits held than the key's limit
	semLeaked    = "leaked"     // permits past expiry that nobody released or reclaimed
)

func (a *app) semaphoresCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "semaphores",
		Short: "Inspect per-key semaphores (tenant limits): list, show, set-limit, verify, drain",
		Long: `Operate pgcoord's semaphores (package semaphore): each key — typically a tenant — may hold at
most its limit of permits cluster-wide. A permit is a lease with a fence token: a holder that
stops renewing loses it when it expires, judged by the database clock, and an expired
permit is reclaimed by the next admission to its key. Every subcommand calls the same
public API (package semaphore) a Go program calls.

'semaphores verify' is the probe for monitoring: it exits 3 when a key holds more permits
than its limit, or holds permits past their expiry (leaked slots).`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.semaphoresListCommand(), a.semaphoresShowCommand(), a.semaphoresSetLimitCommand(),
		a.semaphoresVerifyCommand(), a.semaphoresDrainCommand())
	return cmd
}

// semKeyJSON is one key in `semaphores list --json` (and the top of `show --json`). Every
// key is always present; a time that does not apply (no waiter, no permit) is null, and so
// is its age.
type semKeyJSON struct {
	Key               string   `json:"key"`
	Limit             int      `json:"limit"`
	Weight            int      `json:"weight"`
	FenceToken        int64    `json:"fence_token"`
	Held              int      `json:"held"`
	Expired           int      `json:"expired"`
	Waiters           int      `json:"waiters"`
	OldestWaiterSince *string  `json:"oldest_waiter_since"`
	OldestWaiterAgeMS *int64   `json:"oldest_waiter_age_ms"`
	OldestPermitAt    *string  `json:"oldest_permit_at"`
	OldestPermitAgeMS *int64   `json:"oldest_permit_age_ms"`
	Demand            int64    `json:"demand"`
	VTime             float64  `json:"vtime"`
	Admitted          int64    `json:"admitted"`
	Refused           int64    `json:"refused"`
	Waited            int64    `json:"waited"`
	WaitP50MS         *float64 `json:"wait_p50_ms"`
	WaitP99MS         *float64 `json:"wait_p99_ms"`
	OverLimit         bool     `json:"over_limit"`
	DBNow             *string  `json:"db_now"`
}

// semAgeMS is now - t in milliseconds (never negative), null for the zero time.
func semAgeMS(t, now time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	ms := max(now.Sub(t), 0).Milliseconds()
	return &ms
}

// semAge is now - t for tables ("5m12s"), "-" for the zero time.
func semAge(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(t, now)
}

func toSemKeyJSON(s semaphore.KeyStatus) semKeyJSON {
	vtime := s.VTime
	if math.IsInf(vtime, 0) || math.IsNaN(vtime) { // JSON cannot carry them
		vtime = 0
	}
	return semKeyJSON{
		Key: s.Key, Limit: s.Limit, Weight: s.Weight, FenceToken: s.Token, Held: s.Held, Expired: s.Expired,
		Waiters: s.Waiters, OldestWaiterSince: jsonTime(s.OldestWaiterSince), OldestWaiterAgeMS: semAgeMS(s.OldestWaiterSince, s.DBNow),
		OldestPermitAt: jsonTime(s.OldestPermitAt), OldestPermitAgeMS: semAgeMS(s.OldestPermitAt, s.DBNow),
		Demand: s.Demand, VTime: vtime, Admitted: s.Admitted, Refused: s.Refused, OverLimit: s.OverLimit(),
		Waited: s.Waited, WaitP50MS: semWaitMS(s.WaitP50, s.Waited), WaitP99MS: semWaitMS(s.WaitP99, s.Waited),
		DBNow: jsonTime(s.DBNow),
	}
}

// semWaitMS is a wait quantile in milliseconds, null when no admission was counted (a
// quantile of nothing is not 0).
func semWaitMS(d time.Duration, waited int64) *float64 {
	if waited == 0 {
		return nil
	}
	ms := math.Round(float64(d)/float64(time.Microsecond)) / 1000
	return &ms
}

// semWaits is the "p50/p99" of admission waits for tables ("0s/6.9s"), "-" when no
// admission was counted. The quantiles are within about 20%, so two digits are plenty.
func semWaits(s semaphore.KeyStatus) string {
	if s.Waited == 0 {
		return "-"
	}
	return semWait(s.WaitP50) + "/" + semWait(s.WaitP99)
}

// semWaitsLong is semWaits with the number of admissions it counts, for show.
func semWaitsLong(s semaphore.KeyStatus) string {
	if s.Waited == 0 {
		return "- (no admission in the last 5 to 10 minutes)"
	}
	return fmt.Sprintf("%s (%d admissions in the last 5 to 10 minutes)", semWaits(s), s.Waited)
}

func semWait(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return age(time.Time{}, time.Time{}.Add(d))
}

// semStatus is the one-word verdict of a key for tables: over_limit wins over leaked.
func semStatus(s semaphore.KeyStatus) string {
	switch {
	case s.OverLimit():
		return semOverLimit
	case s.Expired > 0:
		return semLeaked
	}
	return semOK
}

// listSemaphores reads keys page by page in key order, at most limit of them (all when
// limit < 0), and reports whether there are more.
func listSemaphores(ctx context.Context, pool *pgxpool.Pool, limit int) (all []semaphore.KeyStatus, more bool, err error) {
	var opts semaphore.ListOpts
	all, more, err = page.Collect(limit, semPageSize, func(last *semaphore.KeyStatus, n int) ([]semaphore.KeyStatus, error) {
		if last != nil {
			opts.After = last.Key
		}
		opts.Limit = n
		return semaphore.List(ctx, pool, &opts)
	})
	if err != nil {
		return nil, false, argError(err)
	}
	return all, more, nil
}

func (a *app) semaphoresListCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List semaphore keys in key order: limit, permits held and leaked, waiters, demand, counters",
		Long: `List the semaphore keys in key order, judged by the database clock:

  LIMIT          the most permits the key may hold at once
  WEIGHT         its share in fair admission across keys (semaphore.Next)
  HELD           unexpired permits
  EXPIRED        permits past their expiry that nobody released (a holder that died or
                 stopped renewing): leaked slots, reclaimed by the key's next admission
  WAITERS        callers of a blocking acquire waiting in line for the key
  OLDEST WAITER  how long the first waiter in line has waited ("-": none)
  OLDEST PERMIT  how long ago the oldest unexpired permit was granted ("-": none)
  DEMAND         units of work of the key not yet done: queued, or in hand under a permit
                 of semaphore.Next (semaphore.AddDemand adds them, semaphore.Done
                 consumes them)
  ADMITTED, REFUSED  admissions and refusals since the key was created
  WAIT P50/P99   median and 99th percentile of how long the admissions of the last 5 to 10
                 minutes stood in line, recorded by the database at admission (within
                 about 20%; 0s: admitted at once; "-": no admission)
  STATUS         over_limit (HELD > LIMIT), leaked (EXPIRED > 0), or ok

At most --limit keys are shown (a note on stderr says when there are more); the list is
read page by page, so it is not one snapshot.

With --json: an array ([] when empty) of objects with the keys key, limit, weight,
fence_token, held, expired, waiters, oldest_waiter_since, oldest_waiter_age_ms,
oldest_permit_at, oldest_permit_age_ms, demand, vtime, admitted, refused, waited,
wait_p50_ms, wait_p99_ms (null when waited is 0), over_limit, db_now.`,
		Example: `  pgcoord semaphores list
  pgcoord semaphores list --json | jq -r '.[] | select(.waiters > 0) | .key'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			keys, more, err := listSemaphores(ctx, pool, limit)
			if err != nil {
				return err
			}
			if more {
				fmt.Fprintf(a.errOut, "pgcoord: showing the first %d semaphore keys; there are more (raise --limit)\n", limit)
			}
			if a.json {
				js := make([]semKeyJSON, 0, len(keys))
				for _, s := range keys {
					js = append(js, toSemKeyJSON(s))
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintln(tw, "KEY\tLIMIT\tWEIGHT\tHELD\tEXPIRED\tWAITERS\tOLDEST WAITER\tOLDEST PERMIT\tDEMAND\tADMITTED\tREFUSED\tWAIT P50/P99\tSTATUS")
			for _, s := range keys {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Key, s.Limit, s.Weight, s.Held, s.Expired,
					s.Waiters, semAge(s.OldestWaiterSince, s.DBNow), semAge(s.OldestPermitAt, s.DBNow), s.Demand,
					s.Admitted, s.Refused, semWaits(s), semStatus(s))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many keys")
	return cmd
}

// semPermitJSON is one permit in `semaphores show --json`.
type semPermitJSON struct {
	Holder     string  `json:"holder"`
	FenceToken int64   `json:"fence_token"`
	AcquiredAt *string `json:"acquired_at"`
	RenewedAt  *string `json:"renewed_at"`
	ExpiresAt  *string `json:"expires_at"`
	AgeMS      int64   `json:"age_ms"`
	TTLLeftMS  int64   `json:"ttl_left_ms"`
	Expired    bool    `json:"expired"`
	Reserved   bool    `json:"reserved"`
}

func toSemPermitJSON(p semaphore.PermitInfo) semPermitJSON {
	left := p.ExpiresAt.Sub(p.DBNow)
	return semPermitJSON{
		Holder: p.Holder, FenceToken: p.Token, AcquiredAt: jsonTime(p.AcquiredAt), RenewedAt: jsonTime(p.RenewedAt),
		ExpiresAt: jsonTime(p.ExpiresAt), AgeMS: max(p.DBNow.Sub(p.AcquiredAt), 0).Milliseconds(),
		TTLLeftMS: max(left, 0).Milliseconds(), Expired: left <= 0, Reserved: p.Reserved,
	}
}

// semTTLLeft is what a permit has left by the database clock, or how long ago it expired.
func semTTLLeft(p semaphore.PermitInfo) string {
	d := p.ExpiresAt.Sub(p.DBNow)
	if d <= 0 {
		return "expired " + age(p.ExpiresAt, p.DBNow) + " ago"
	}
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// semShowJSON is the --json output of `semaphores show`: the key's object plus its permits.
type semShowJSON struct {
	semKeyJSON
	Permits []semPermitJSON `json:"permits"`
}

// getSemaphore reads one key for show and drain: an unknown key is a plain failure with a
// clear message.
func getSemaphore(ctx context.Context, pool *pgxpool.Pool, key string) (semaphore.KeyStatus, error) {
	s, err := semaphore.Get(ctx, pool, key)
	if errors.Is(err, semaphore.ErrNotFound) {
		return s, fmt.Errorf("no such semaphore %q ('pgcoord semaphores list' shows the keys)", key)
	}
	return s, argError(err)
}

// semPermits reads the permits of key, held and expired.
func semPermits(ctx context.Context, pool *pgxpool.Pool, key string) ([]semaphore.PermitInfo, error) {
	ps, err := semaphore.Permits(ctx, pool, key)
	if errors.Is(err, semaphore.ErrNotFound) {
		return []semaphore.PermitInfo{}, nil
	}
	return ps, argError(err)
}

// semKeyArg checks a key given on the command line.
func semKeyArg(key string) error {
	if err := pgcoord.ValidateName("semaphore key", key); err != nil {
		return usageError{err}
	}
	return nil
}

func (a *app) semaphoresShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show KEY",
		Short: "Show one semaphore key and its permits (exit 1 if no such key)",
		Long: `Show one semaphore key — its limit, weight, permits held and expired, waiters, demand and
counters — and every permit it holds: holder, fence token, whether it is reserved, age
and time left by the database clock (an expired permit says how long ago it expired). A
reserved permit is one of semaphore.Next: it holds one unit of the key's demand (a job in
hand), which semaphore.Done consumes when the job is done; if the permit ends otherwise
(released, expired, drained) the unit goes back to the queue. A key that does not exist
is an error (exit 1).

With --json: the object of 'semaphores list --json' plus "permits", an array ([] when
none) of objects with the keys holder, fence_token, reserved, acquired_at, renewed_at,
expires_at, age_ms, ttl_left_ms (0 once expired) and expired.`,
		Example: `  pgcoord semaphores show tenant:42
  pgcoord semaphores show tenant:42 --json`,
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
			s, err := getSemaphore(ctx, pool, key)
			if err != nil {
				return err
			}
			permits, err := semPermits(ctx, pool, key)
			if err != nil {
				return err
			}
			if a.json {
				js := semShowJSON{semKeyJSON: toSemKeyJSON(s), Permits: make([]semPermitJSON, 0, len(permits))}
				for _, p := range permits {
					js.Permits = append(js.Permits, toSemPermitJSON(p))
				}
				return a.printJSON(js)
			}
			a.printSemaphore(s)
			fmt.Fprintln(a.out)
			if len(permits) == 0 {
				fmt.Fprintln(a.out, "no permits held")
				return nil
			}
			tw := a.table()
			fmt.Fprintln(tw, "HOLDER\tTOKEN\tRESERVED\tAGE\tTTL LEFT\tACQUIRED\tRENEWED")
			for _, p := range permits {
				reserved := "-"
				if p.Reserved {
					reserved = "yes"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Holder, p.Token, reserved, age(p.AcquiredAt, p.DBNow), semTTLLeft(p),
					preciseTime(p.AcquiredAt), preciseTime(p.RenewedAt))
			}
			return tw.Flush()
		},
	}
}

// printSemaphore prints one key as aligned "field: value" lines.
func (a *app) printSemaphore(s semaphore.KeyStatus) {
	tw := a.table()
	waiter := "-"
	if !s.OldestWaiterSince.IsZero() {
		waiter = fmt.Sprintf("waiting %s (since %s)", age(s.OldestWaiterSince, s.DBNow), preciseTime(s.OldestWaiterSince))
	}
	permit := "-"
	if !s.OldestPermitAt.IsZero() {
		permit = fmt.Sprintf("granted %s ago (%s)", age(s.OldestPermitAt, s.DBNow), preciseTime(s.OldestPermitAt))
	}
	expired := "0"
	if s.Expired > 0 {
		expired = fmt.Sprintf("%d (past expiry, never released: reclaimed by the next admission)", s.Expired)
	}
	rows := [][2]string{
		{"key", s.Key},
		{"limit", strconv.Itoa(s.Limit)},
		{"weight", strconv.Itoa(s.Weight)},
		{"held", strconv.Itoa(s.Held)},
		{"expired", expired},
		{"waiters", strconv.Itoa(s.Waiters)},
		{"oldest waiter", waiter},
		{"oldest permit", permit},
		{"fence token", strconv.FormatInt(s.Token, 10)},
		{"demand", strconv.FormatInt(s.Demand, 10)},
		{"admitted", strconv.FormatInt(s.Admitted, 10)},
		{"refused", strconv.FormatInt(s.Refused, 10)},
		{"wait p50/p99", semWaitsLong(s)},
		{"status", semStatus(s)},
		{"database now", preciseTime(s.DBNow)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

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
			if err := semaphore.SetLimit(ctx, pool, key, limit, opts); err != nil {
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
			keys, _, err := listSemaphores(ctx, pool, -1)
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
						fmt.Fprintf(a.out, "%s %s: %s\n", strings.ToUpper(strings.ReplaceAll(c.Status, "_", "-")), c.Key, strings.Join(c.Problems, "; "))
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
				permits, err = semaphore.Drain(ctx, pool, key)
				if errors.Is(err, semaphore.ErrNotFound) {
					permits, err = nil, nil // the key exists: nothing to revoke
				}
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
