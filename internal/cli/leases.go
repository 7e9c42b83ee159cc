package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Environment variables `pgcoord leases run` adds to its command's environment.
const (
	EnvFenceToken  = "PGCOORD_FENCE_TOKEN"
	EnvLeaseName   = "PGCOORD_LEASE_NAME"
	EnvLeaseHolder = "PGCOORD_LEASE_HOLDER"
)

// Lease states as `pgcoord leases list` and `show` print them.
const (
	stateHeld    = "held"    // an unexpired grant
	stateExpired = "expired" // a grant that expired, not released, not taken since
	stateFree    = "free"    // released, expired by an operator, or never held since
)

// exitCode makes Run exit with that code and print nothing more: the command has already
// said why on stderr (or, for a child's exit status, the child has).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// exitCodeOf returns the code of an exitCode in err's chain, or ExitFailure.
func exitCodeOf(err error) int {
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	return ExitFailure
}

// argError turns the API's input errors (ErrInvalidName, ErrInvalidArgument) into usage
// errors (exit 2) and leaves every other error alone.
func argError(err error) error {
	if errors.Is(err, pgcoord.ErrInvalidName) || errors.Is(err, pgcoord.ErrInvalidArgument) {
		return usageError{err}
	}
	return err
}

func (a *app) leasesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "List, inspect and expire leases, or run a command under a lease",
		Long: `Operate pgcoord's leases: named, time-limited grants with fence tokens, judged by the
database clock. Every subcommand calls the same public API (package leases) a Go program
calls; 'leases run' runs any command under a lease, renewed while it runs.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.leasesListCommand(), a.leasesShowCommand(), a.leasesExpireCommand(), a.leasesRunCommand())
	return cmd
}

// leaseJSON is one lease in --json output. Every key is always present; a value that does
// not apply (no holder, never renewed, not expired by an operator, ...) is null.
type leaseJSON struct {
	Name       string            `json:"name"`
	State      string            `json:"state"`
	Holder     *string           `json:"holder"`
	FenceToken int64             `json:"fence_token"`
	Metadata   map[string]string `json:"metadata"`
	AcquiredAt *string           `json:"acquired_at"`
	RenewedAt  *string           `json:"renewed_at"`
	ExpiresAt  *string           `json:"expires_at"`
	ReleasedAt *string           `json:"released_at"`
	ExpiredBy  *string           `json:"expired_by"`
	TTLLeftMS  int64             `json:"ttl_left_ms"`
	// Counters across the name's grants (see leases.Info).
	NearMisses     int64   `json:"near_misses"`
	LastNearMissAt *string `json:"last_near_miss_at"`
	ForcedExpiries int64   `json:"forced_expiries"`
	DBNow          *string `json:"db_now"`
}

func leaseState(i leases.Info) string {
	switch {
	case i.Held():
		return stateHeld
	case i.Holder != "":
		return stateExpired
	default:
		return stateFree
	}
}

func toLeaseJSON(i leases.Info) leaseJSON {
	meta := i.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return leaseJSON{
		Name: i.Name, State: leaseState(i), Holder: nullString(i.Holder), FenceToken: i.Token,
		Metadata: meta, AcquiredAt: jsonTime(i.AcquiredAt), RenewedAt: jsonTime(i.RenewedAt),
		ExpiresAt: jsonTime(i.ExpiresAt), ReleasedAt: jsonTime(i.ReleasedAt),
		ExpiredBy: nullString(i.ExpiredBy), TTLLeftMS: i.Remaining().Milliseconds(),
		NearMisses: i.NearMisses, LastNearMissAt: jsonTime(i.LastNearMissAt), ForcedExpiries: i.ForcedExpiries,
		DBNow: jsonTime(i.DBNow),
	}
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// jsonTime formats t in UTC as RFC 3339 with the database's sub-second precision; the zero
// time is null.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

// preciseTime formats t in UTC as RFC 3339 with milliseconds for people; zero is "-".
func preciseTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// dash shows an empty value as "-" in tables.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ttlLeft formats the time a grant has left, by the database clock; "-" if not held.
func ttlLeft(i leases.Info) string {
	if !i.Held() {
		return "-"
	}
	d := i.Remaining()
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// defaultListLimit is how many leases `leases list` shows unless --limit says otherwise.
const defaultListLimit = 1000

func (a *app) leasesListCommand() *cobra.Command {
	var (
		held, expired   bool
		limit, pageSize int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List leases in name order: state, holder, fence token, time left",
		Long: `List leases in name order with their state by the database clock:

  held     an unexpired grant (TTL LEFT is what remains of it)
  expired  a grant that expired without being released and was not taken since
  free     released, expired by an operator, or otherwise without a holder

HOST, PID and APP come from the metadata the holder stored with its grant. At most --limit
leases are shown (a note on stderr says when there are more); the list is read page by
page, so it is not one snapshot.

With --json: an array ([] when empty) of objects with the keys name, state, holder,
fence_token, metadata, acquired_at, renewed_at, expires_at, released_at, expired_by,
ttl_left_ms, near_misses, last_near_miss_at, forced_expiries, db_now. A near miss is a
renewal that found less than a quarter of its grant left, by the database clock.`,
		Example: `  pgcoord leases list
  pgcoord leases list --held
  pgcoord leases list --expired --json | jq -r '.[].name'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if held && expired {
				return usagef("--held and --expired are mutually exclusive")
			}
			if limit < 1 {
				return usagef("--limit %d: want at least 1", limit)
			}
			if pageSize < 1 || pageSize > leases.MaxListLimit {
				return usagef("--page-size %d: want 1 to %d", pageSize, leases.MaxListLimit)
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()

			opts := leases.ListOpts{Held: held, Expired: expired}
			all, more, err := page.Collect(limit, pageSize, func(last *leases.Info, n int) ([]leases.Info, error) {
				if last != nil {
					opts.After = last.Name
				}
				opts.Limit = n
				return leases.List(ctx, pool, &opts)
			})
			if err != nil {
				return argError(err)
			}
			if more {
				fmt.Fprintf(a.errOut, "pgcoord: showing the first %d leases; there are more (raise --limit, or list from the last name with a narrower filter)\n", limit)
			}

			if a.json {
				js := make([]leaseJSON, 0, len(all))
				for _, i := range all {
					js = append(js, toLeaseJSON(i))
				}
				return a.printJSON(js)
			}
			tw := a.table()
			fmt.Fprintln(tw, "NAME\tSTATE\tHOLDER\tTOKEN\tTTL LEFT\tHOST\tPID\tAPP\tACQUIRED")
			for _, i := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", i.Name, leaseState(i), dash(i.Holder), i.Token,
					ttlLeft(i), dash(i.Metadata["host"]), dash(i.Metadata["pid"]), dash(i.Metadata["app"]), rfc3339(i.AcquiredAt))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&held, "held", false, "only leases with an unexpired holder")
	f.BoolVar(&expired, "expired", false, "only grants that expired without being released")
	f.IntVar(&limit, "limit", defaultListLimit, "show at most this many leases")
	f.IntVar(&pageSize, "page-size", 1000, "leases read per query")
	_ = f.MarkHidden("page-size")
	return cmd
}

// getLease reads one lease for show and expire: an unknown name is a plain failure with a
// clear message.
func getLease(ctx context.Context, pool *pgxpool.Pool, name string) (leases.Info, error) {
	info, err := leases.Get(ctx, pool, name)
	if errors.Is(err, leases.ErrNotFound) {
		return info, fmt.Errorf("no such lease %q", name)
	}
	return info, argError(err)
}

func (a *app) leasesShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show one lease in detail (exit 1 if no such lease)",
		Long: `Show one lease in detail: state, holder, fence token, time left by the database clock,
timestamps, who expired it, and the holder's metadata. A name that was never granted is
an error (exit 1, "no such lease"). With --json: one object, as in 'leases list --json'.`,
		Example: `  pgcoord leases show order:42
  pgcoord leases show order:42 --json`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			name := args[0]
			if err := pgcoord.ValidateName("lease", name); err != nil {
				return usageError{err}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			info, err := getLease(ctx, pool, name)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(toLeaseJSON(info))
			}
			a.printLease(info)
			return nil
		},
	}
}

// printLease prints one lease as aligned "field: value" lines.
func (a *app) printLease(i leases.Info) {
	tw := a.table()
	left := ttlLeft(i)
	if i.Held() {
		left += " (by the database clock)"
	}
	rows := [][2]string{
		{"name", i.Name},
		{"state", leaseState(i)},
		{"holder", dash(i.Holder)},
		{"fence token", fmt.Sprint(i.Token)},
		{"ttl left", left},
		{"acquired at", preciseTime(i.AcquiredAt)},
		{"renewed at", preciseTime(i.RenewedAt)},
		{"expires at", preciseTime(i.ExpiresAt)},
		{"released at", preciseTime(i.ReleasedAt)},
		{"expired by", dash(i.ExpiredBy)},
		{"near misses", nearMisses(i)},
		{"forced expiries", fmt.Sprint(i.ForcedExpiries)},
		{"metadata", dash(formatMetadata(i.Metadata))},
		{"database now", preciseTime(i.DBNow)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

// formatMetadata prints metadata as key=value pairs in key order.
func formatMetadata(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}

// expireJSON is the --json output of `leases expire`.
type expireJSON struct {
	DryRun  bool      `json:"dry_run"`
	Expired bool      `json:"expired"`
	By      string    `json:"by"`
	Lease   leaseJSON `json:"lease"`
}

// defaultExpiredBy names the operator: "$USER@host via pgcoord-cli".
func (a *app) defaultExpiredBy() string {
	who := ""
	for _, v := range []string{"USER", "LOGNAME"} {
		if u, ok := a.lookupEnv(v); ok && u != "" {
			who = u
			break
		}
	}
	if who == "" {
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s via %s", dash(who), dash(host), AppName)
}

func (a *app) leasesExpireCommand() *cobra.Command {
	var (
		dryRun bool
		by     string
	)
	cmd := &cobra.Command{
		Use:   "expire NAME",
		Short: "Force a held lease to expire now (operator action); --dry-run shows what it would do",
		Long: `Force the lease NAME to expire now, whoever holds it. It becomes free at once and a
waiting acquirer is woken; the old holder's renewals, releases and in-database checks fail
from then on, and the next grant gets a higher fence token, so fenced writes reject the
old holder. The lease records who expired it (--by).

It prints who held the lease and with which token. A lease that has no holder (released,
already expired by an operator) is an error (exit 1), as is a name never granted. A grant
that expired by time but was not taken since still has a holder, and can be expired.

--dry-run reads the lease and says what would happen, changing nothing; it exits as the
real command would. With --json: {"dry_run", "expired", "by", "lease"}, where lease is the
lease as it was before (the object of 'leases list --json').`,
		Example: `  pgcoord leases expire order:42 --dry-run
  pgcoord leases expire order:42 --by "alice: worker wedged, INC-123"`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			name := args[0]
			if err := pgcoord.ValidateName("lease", name); err != nil {
				return usageError{err}
			}
			if by == "" {
				by = a.defaultExpiredBy()
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()

			var info leases.Info
			if dryRun {
				if info, err = getLease(ctx, pool, name); err != nil {
					return err
				}
				if info.Holder == "" {
					return notHeld(info)
				}
			} else {
				info, err = leases.Expire(ctx, pool, name, by)
				if errors.Is(err, leases.ErrNotFound) {
					// Never granted, or not held: say which.
					cur, gerr := getLease(ctx, pool, name)
					if gerr != nil {
						return gerr
					}
					return notHeld(cur)
				}
				if err != nil {
					return argError(err)
				}
			}

			if a.json {
				return a.printJSON(expireJSON{DryRun: dryRun, Expired: !dryRun, By: by, Lease: toLeaseJSON(info)})
			}
			how := fmt.Sprintf("%s left", ttlLeft(info))
			if !info.Held() {
				how = "its grant had already expired at " + preciseTime(info.ExpiresAt) + " without being released"
			}
			if dryRun {
				fmt.Fprintf(a.out, "would expire lease %q: held by %s with fence token %d (%s)\n", name, info.Holder, info.Token, how)
				fmt.Fprintf(a.out, "nothing changed (--dry-run); the next grant would get a fence token above %d\n", info.Token)
				return nil
			}
			fmt.Fprintf(a.out, "expired lease %q: it was held by %s with fence token %d (%s)\n", name, info.Holder, info.Token, how)
			fmt.Fprintf(a.out, "the old holder's renewals, releases and checks now fail; the next grant gets a fence token above %d\n", info.Token)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dryRun, "dry-run", false, "show what would be expired, change nothing")
	f.StringVar(&by, "by", "", `who expires it, recorded with the lease (default "$USER@host via pgcoord-cli")`)
	return cmd
}

// notHeld is the error for expiring a lease that has no holder.
func notHeld(i leases.Info) error {
	if i.ExpiredBy != "" {
		return fmt.Errorf("lease %q is not held: %s expired it at %s (fence token %d)", i.Name, i.ExpiredBy, preciseTime(i.ReleasedAt), i.Token)
	}
	return fmt.Errorf("lease %q is not held: released at %s (fence token %d)", i.Name, preciseTime(i.ReleasedAt), i.Token)
}

// Exit codes of `leases run` besides the child's own.
const (
	exitCannotExecute = 126 // the command was found but could not be started
	exitNotFound      = 127 // the command was not found
)

// errGaveUp is the cause of cancelling `leases run`'s wait when --wait elapses.
var errGaveUp = errors.New("gave up waiting for the lease")

// lockedWriter serializes writes from several goroutines (the child's stderr copier, the
// renewal loop's logger, pgcoord's own messages) to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// forwardedSignal picks the signal to stop the child with for the cause of its context's
// cancellation: the signal pgcoord received (signal.NotifyContext's cause names it), else
// SIGTERM.
func forwardedSignal(cause error) syscall.Signal {
	if cause != nil && !errors.Is(cause, leases.ErrLost) {
		for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
			if cause.Error() == s.String()+" signal received" {
				return s
			}
		}
	}
	return syscall.SIGTERM
}

// sigName names the signals `leases run` sends.
func sigName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return s.String()
}

// childResult is what became of the command `leases run` started.
type childResult struct {
	started bool
	code    int   // exit code, 128+signal if a signal killed it
	stopped error // why pgcoord stopped it (lease lost, interrupted), or nil
}

func (a *app) leasesRunCommand() *cobra.Command {
	var (
		name, holder     string
		ttl, grace, wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run --name NAME --ttl TTL [flags] -- COMMAND [ARG...]",
		Short: "Run a command while holding a lease, renewed as it runs; stop it if the lease is lost",
		Long: `Acquire the lease --name (waiting for it, woken as soon as it is released), run COMMAND
with the lease's fence token in its environment, renew the lease every third of --ttl while
the command runs, and release it when the command exits.

The command gets stdin, stdout and stderr of pgcoord, and its environment plus:
  PGCOORD_FENCE_TOKEN   the grant's fence token: send it with every write the lease protects
  PGCOORD_LEASE_NAME    the lease's name
  PGCOORD_LEASE_HOLDER  the holder identity (--holder, default host/pid/random)

The command runs in a process group of its own. If the lease is lost while it runs (an
operator expired it, another holder took it over, or no renewal succeeded before the
trust deadline), pgcoord says so on stderr and stops the whole group: SIGTERM, then
SIGKILL after --grace. SIGINT, SIGTERM and SIGHUP sent to pgcoord (Ctrl-C included) are
forwarded to the group as the same signal, once; SIGKILL follows after --grace. A command
that reads from the terminal is stopped by the terminal (SIGTTIN): run non-interactive
commands.

Exit status:
  the command's         when it ran to its end holding the lease (128+N if signal N killed it)
  the command's, or 1   when pgcoord stopped it or the lease was lost before it was
                        released: never 0 then (1 if the command still exited 0)
  1                     pgcoord failed, or gave up waiting (--wait), or was interrupted
                        before the command started
  2                     usage error (missing --name, --ttl or command, bad values)
  126 / 127             the command could not be started / was not found

Fencing is what makes this safe: a command paused past its TTL keeps running until it is
stopped, and only a store that rejects lower tokens stops its late writes.`,
		Example: `  pgcoord leases run --name nightly-report --ttl 30s -- ./report.sh
  pgcoord leases run --name reindex --ttl 1m --wait 0 -- psql -c 'REINDEX TABLE big'
  pgcoord leases run --name sync --ttl 20s --holder "$HOSTNAME" -- sh -c 'exec sync --token "$PGCOORD_FENCE_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s: missing the command to run (after --)", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			switch {
			case name == "":
				return usagef("--name is required")
			case !cmd.Flags().Changed("ttl"):
				return usagef("--ttl is required")
			case ttl < leases.MinTTL || ttl > leases.MaxTTL:
				return usagef("--ttl %v: want %v to %v", ttl, leases.MinTTL, leases.MaxTTL)
			case grace < 0:
				return usagef("--grace %v: want 0 or more", grace)
			case wait < 0:
				return usagef("--wait %v: want 0 or more", wait)
			}
			if err := pgcoord.ValidateName("lease", name); err != nil {
				return usageError{err}
			}
			if holder == "" {
				holder = pgcoord.NewHolderID()
			} else if err := pgcoord.ValidateName("holder", holder); err != nil {
				return usageError{err}
			}
			if _, err := exec.LookPath(args[0]); err != nil {
				fmt.Fprintf(a.errOut, "pgcoord: %s: command not found\n", args[0])
				return exitCode(exitNotFound)
			}

			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.runUnderLease(ctx, pool, runSpec{
				name: name, holder: holder, ttl: ttl, grace: grace,
				wait: wait, waitSet: cmd.Flags().Changed("wait"), argv: args,
			})
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything from COMMAND on belongs to the command
	f.StringVar(&name, "name", "", "the lease's name (required)")
	f.DurationVar(&ttl, "ttl", 0, "the lease's TTL, renewed every third of it (required)")
	f.StringVar(&holder, "holder", "", "holder identity (default: host/pid/random, new per run)")
	f.DurationVar(&grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the command must stop (0: SIGKILL at once)")
	f.DurationVar(&wait, "wait", 0, "give up (exit 1) if the lease is not granted within this time; 0: try once (default: wait as long as it takes)")
	return cmd
}

// runSpec is what `leases run` was asked to do.
type runSpec struct {
	name, holder     string
	ttl, grace, wait time.Duration
	waitSet          bool
	argv             []string
}

// runUnderLease runs spec.argv under the lease with leases.Do and maps the outcome to an
// exit status.
func (a *app) runUnderLease(ctx context.Context, pool *pgxpool.Pool, spec runSpec) error {
	errW := a.errOut
	if _, ok := errW.(*os.File); !ok {
		errW = &lockedWriter{w: errW}
	}
	opts := &leases.DoOpts{
		AcquireOpts: leases.AcquireOpts{
			Holder:   spec.holder,
			Metadata: map[string]string{"command": filepath.Base(spec.argv[0])},
		},
		Logger:  slog.New(slog.NewTextHandler(errW, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Metrics: &leases.Metrics{},
	}

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	var (
		timer *time.Timer
		trial leases.Lease // the grant of --wait 0's single attempt
	)
	switch {
	case spec.waitSet && spec.wait == 0:
		// Try once. Do then acquires as the same holder, which gives back this very grant
		// (same token) instead of waiting.
		l, err := leases.TryAcquire(ctx, pool, spec.name, spec.ttl, &opts.AcquireOpts)
		if errors.Is(err, leases.ErrHeld) {
			return a.gaveUp(ctx, pool, spec)
		}
		if err != nil {
			return argError(err)
		}
		trial = l
	case spec.waitSet:
		timer = time.AfterFunc(spec.wait, func() { cancelRun(errGaveUp) })
		defer timer.Stop()
	}

	var res childResult
	err := leases.Do(runCtx, pool, spec.name, spec.ttl, func(fnCtx context.Context, l leases.Lease) error {
		if timer != nil && !timer.Stop() {
			return errGaveUp // --wait elapsed just as the lease was granted
		}
		if fnCtx.Err() != nil {
			return context.Cause(fnCtx)
		}
		var err error
		res, err = a.runChild(fnCtx, l, spec, errW)
		return err
	}, opts)

	if !res.started {
		if trial.Token != 0 {
			// Do never got to the grant the single attempt made: give it back.
			relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = leases.Release(relCtx, pool, trial, nil)
			cancel()
		}
		switch {
		case errors.Is(context.Cause(runCtx), errGaveUp) || errors.Is(err, errGaveUp):
			return a.gaveUp(ctx, pool, spec)
		case ctx.Err() != nil:
			return fmt.Errorf("interrupted (%v) before the command started; lease %q was not used", context.Cause(ctx), spec.name)
		case errors.Is(err, errStartFailed):
			return exitCode(exitCannotExecute) // already reported
		case err != nil:
			return argError(err)
		}
		return errors.New("the command was not started") // unreachable: fn always starts it or fails
	}

	code := res.code
	lost := errors.Is(err, leases.ErrLost)
	switch {
	case lost && !errors.Is(res.stopped, leases.ErrLost):
		// Do found the lease gone only at release: the command finished, but not all of it
		// ran under the lease.
		fmt.Fprintf(errW, "pgcoord: lease %q was no longer held when the command finished (%v): part of the command may have run without it\n", spec.name, err)
	case err != nil && !lost:
		fmt.Fprintf(errW, "pgcoord: warning: could not release lease %q: %v; it stays held until its grant expires\n", spec.name, err)
	}
	if (lost || res.stopped != nil) && code == 0 {
		code = ExitFailure // stopped or lost: never report success
	}
	if code != 0 {
		return exitCode(code)
	}
	return nil
}

// errHangup is the cause of stopping the command when pgcoord gets SIGHUP; its text is the
// one signal.NotifyContext would give, so forwardedSignal forwards SIGHUP.
var errHangup = errors.New(syscall.SIGHUP.String() + " signal received")

// errStartFailed means the command could not be started; runChild has said why.
var errStartFailed = errors.New("the command could not be started")

// runChild starts the command with the lease in its environment and waits for it. When
// ctx ends (lease lost, pgcoord interrupted) it signals the command's process group,
// then kills it after the grace period.
func (a *app) runChild(ctx context.Context, l leases.Lease, spec runSpec, errW io.Writer) (childResult, error) {
	c := exec.Command(spec.argv[0], spec.argv[1:]...)
	c.Env = append(os.Environ(),
		fmt.Sprintf("%s=%d", EnvFenceToken, l.Token),
		EnvLeaseName+"="+l.Name,
		EnvLeaseHolder+"="+l.Holder,
	)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, a.out, errW
	setProcessGroup(c)
	// Bounds how long Wait reads the command's output after it exited, should a process it
	// left behind keep the pipes open (only when pgcoord's output is not a file).
	c.WaitDelay = max(spec.grace, time.Second)
	// main turns SIGINT and SIGTERM into ctx's cancellation. A hangup would kill pgcoord and
	// leave the command, in its own process group, running without renewals: catch it here,
	// unless it is ignored (nohup).
	hup := make(chan os.Signal, 1)
	if !signal.Ignored(syscall.SIGHUP) {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}

	if err := c.Start(); err != nil {
		fmt.Fprintf(errW, "pgcoord: cannot run %s: %v\n", spec.argv[0], err)
		return childResult{}, errStartFailed
	}
	res := childResult{started: true}
	pgid := c.Process.Pid
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()

	var waitErr error
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		res.stopped = context.Cause(ctx)
	case <-hup:
		res.stopped = errHangup
	}
	if res.stopped != nil {
		sig := forwardedSignal(res.stopped)
		then := fmt.Sprintf("SIGKILL after %v", spec.grace)
		if spec.grace == 0 {
			sig, then = syscall.SIGKILL, "at once"
		}
		if errors.Is(res.stopped, leases.ErrLost) {
			fmt.Fprintf(errW, "pgcoord: lost lease %q (fence token %d) while the command ran: %v; stopping the command (%s, %s)\n",
				l.Name, l.Token, res.stopped, sigName(sig), then)
		} else {
			fmt.Fprintf(errW, "pgcoord: interrupted (%v); stopping the command (%s, %s)\n", res.stopped, sigName(sig), then)
		}
		_ = signalGroup(pgid, sig)
		waitErr = stopGroup(pgid, spec.grace, done)
	}

	ps := c.ProcessState
	if ps == nil {
		fmt.Fprintf(errW, "pgcoord: waiting for %s: %v\n", spec.argv[0], waitErr)
		res.code = ExitFailure
		return res, nil
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		res.code = 128 + int(ws.Signal())
	default:
		res.code = ps.ExitCode()
	}
	return res, nil
}

// stopGroup waits for the signalled process group pgid: its leader's Wait result on done,
// and any other members, until grace has passed, then kills whatever is left of the group.
func stopGroup(pgid int, grace time.Duration, done <-chan error) error {
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-deadline.C:
		_ = signalGroup(pgid, syscall.SIGKILL)
		return <-done
	}
	// The leader is gone; members that outlive it get the rest of the grace period.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for groupAlive(pgid) {
		select {
		case <-deadline.C:
			_ = signalGroup(pgid, syscall.SIGKILL)
			return waitErr
		case <-tick.C:
		}
	}
	return waitErr
}

// gaveUp reports that the lease was not granted within --wait, naming its holder.
func (a *app) gaveUp(ctx context.Context, pool *pgxpool.Pool, spec runSpec) error {
	what := fmt.Sprintf("after %v", spec.wait)
	if spec.wait == 0 {
		what = "(--wait 0: one attempt)"
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if i, err := leases.Get(rctx, pool, spec.name); err == nil && i.Held() {
		fmt.Fprintf(a.errOut, "pgcoord: gave up waiting for lease %q %s: held by %s (fence token %d, %s left); the command did not run\n",
			spec.name, what, i.Holder, i.Token, ttlLeft(i))
	} else {
		fmt.Fprintf(a.errOut, "pgcoord: gave up waiting for lease %q %s; the command did not run\n", spec.name, what)
	}
	return exitCode(ExitFailure)
}

// nearMisses is the count of renewals that arrived with less than a quarter of their grant
// left, and when the latest was.
func nearMisses(i leases.Info) string {
	if i.NearMisses == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (latest %s)", i.NearMisses, preciseTime(i.LastNearMissAt))
}
