package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/semaphore"
)

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

// listSemaphores reads keys that start with prefix page by page in key order, at most
// limit of them (all when limit < 0), and reports whether there are more.
func listSemaphores(ctx context.Context, pool *pgxpool.Pool, limit int, prefix string) (all []semaphore.KeyStatus, more bool, err error) {
	opts := semaphore.ListOpts{Prefix: prefix}
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
	var (
		limit int
		lf    listFlags
	)
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
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error { return a.printSemaphores(ctx, pool, limit, lf.prefix) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", defaultListLimit, "show at most this many keys")
	addListFlags(cmd, &lf, "only keys that start with this")
	return cmd
}

// printSemaphores reads at most limit keys that start with prefix and prints them.
func (a *app) printSemaphores(ctx context.Context, pool *pgxpool.Pool, limit int, prefix string) error {
	keys, more, err := listSemaphores(ctx, pool, limit, prefix)
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
	return timeLeft(d)
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
	if err := check.Name("semaphore key", key); err != nil {
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
	a.printFields(rows)
}
