package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/page"
	"github.com/pgcoord/pgcoord/leases"
)

// Lease states as `pgcoord leases list` and `show` print them.
const (
	stateHeld    = "held"    // an unexpired grant
	stateExpired = "expired" // a grant that expired, not released, not taken since
	stateFree    = "free"    // released, expired by an operator, or never held since
)

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

// ttlLeft formats the time a grant has left, by the database clock; "-" if not held.
func ttlLeft(i leases.Info) string {
	if !i.Held() {
		return "-"
	}
	return timeLeft(i.Remaining())
}

// defaultListLimit is how many leases `leases list` shows unless --limit says otherwise.
const defaultListLimit = 1000

func (a *app) leasesListCommand() *cobra.Command {
	var (
		held, expired   bool
		limit, pageSize int
		lf              listFlags
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
			if err := lf.checkPrefix(); err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			return a.show(ctx, cmd, &lf, func() error {
				return a.printLeases(ctx, pool, leases.ListOpts{Held: held, Expired: expired, Prefix: lf.prefix}, limit, pageSize)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&held, "held", false, "only leases with an unexpired holder")
	f.BoolVar(&expired, "expired", false, "only grants that expired without being released")
	f.IntVar(&limit, "limit", defaultListLimit, "show at most this many leases")
	f.IntVar(&pageSize, "page-size", 1000, "leases read per query")
	_ = f.MarkHidden("page-size")
	addListFlags(cmd, &lf, "only leases whose name starts with this")
	return cmd
}

// printLeases reads at most limit leases by opts, pageSize per query, and prints them.
func (a *app) printLeases(ctx context.Context, pool *pgxpool.Pool, opts leases.ListOpts, limit, pageSize int) error {
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
			if err := check.Name("lease", name); err != nil {
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
	a.printFields(rows)
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
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s via %s", dash(a.osUser()), dash(host), AppName)
}

// osUser is the name of the user running pgcoord ($USER, $LOGNAME, else the account's).
func (a *app) osUser() string {
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
	return who
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
			if err := check.Name("lease", name); err != nil {
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
				err = a.audited(ctx, pool, "lease.expire", name, func(tx pgx.Tx) (map[string]any, error) {
					info, err = leases.Expire(ctx, tx, name, by)
					return map[string]any{"holder": info.Holder, "fence_token": info.Token, "by": by}, err
				})
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
				fmt.Fprintf(a.out, "would expire lease %q: held by %s with fence token %d (%s)\n", name, base.Printable(info.Holder), info.Token, how)
				fmt.Fprintf(a.out, "nothing changed (--dry-run); the next grant would get a fence token above %d\n", info.Token)
				return nil
			}
			fmt.Fprintf(a.out, "expired lease %q: it was held by %s with fence token %d (%s)\n", name, base.Printable(info.Holder), info.Token, how)
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

// nearMisses is the count of renewals that arrived with less than a quarter of their grant
// left, and when the latest was.
func nearMisses(i leases.Info) string {
	if i.NearMisses == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (latest %s)", i.NearMisses, preciseTime(i.LastNearMissAt))
}
