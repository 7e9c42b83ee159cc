package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgcoord/pgcoord/internal/doctor"
)

func (a *app) doctorCommand() *cobra.Command {
	var o doctor.Options
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this setup and explain each finding; exit 3 when anything needs attention",
		Long: `Check pgcoord and the database around it, and explain each finding:

  schema        pgcoord is installed in the schema and has every migration this build needs
  notify        a LISTEN/NOTIFY round trip works (not when a transaction-mode pooler is in
                the way: waiting then falls back to polling)
  clock         the difference between this host's clock and the database's
  transactions  transactions open longer than --long-transaction, holding back VACUUM
  replication   primary or standby, synchronous or asynchronous standbys, and what that
                means for fence tokens after a failover
  leases        held and expired leases
  semaphores    keys over their limit or with leaked permits (details: semaphores verify)
  jobs          cron jobs overdue or failing (details: jobs check)
  idempotency   keys left in flight by a dead attempt that no client retried
  outbox        dead messages, and topics whose oldest pending message is older than
                --outbox-lag

Each finding is ok, info (worth knowing, nothing to fix) or attention. Exit 3 when any
needs attention, 0 otherwise. With --json: an array of {"check", "status", "summary",
"explain"}.`,
		Example: `  pgcoord doctor
  pgcoord doctor --long-transaction 1m --json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			for name, d := range map[string]int64{"--long-transaction": int64(o.LongTransaction),
				"--max-staleness": int64(o.MaxStaleness), "--notify-timeout": int64(o.NotifyTimeout),
				"--outbox-lag": int64(o.OutboxLag)} {
				if d <= 0 {
					return usagef("%s: want a positive duration", name)
				}
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			findings, err := doctor.Run(ctx, pool, o)
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printJSON(findings); err != nil {
					return err
				}
			} else {
				tw := a.table()
				for _, f := range findings {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(f.Status)), f.Check, f.Summary)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, f := range findings {
					if f.Explain != "" {
						fmt.Fprintf(a.out, "\n%s: %s\n", f.Check, f.Explain)
					}
				}
			}
			if doctor.NeedsAttention(findings) {
				fmt.Fprintln(a.errOut, "pgcoord: some findings need attention")
				return errCheckFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.LongTransaction, "long-transaction", doctorDefaults.LongTransaction, "report transactions open longer than this")
	f.DurationVar(&o.MaxStaleness, "max-staleness", doctorDefaults.MaxStaleness, "a job is overdue when it has not succeeded for its period plus this")
	f.DurationVar(&o.NotifyTimeout, "notify-timeout", doctorDefaults.NotifyTimeout, "how long to wait for the LISTEN/NOTIFY probe")
	f.DurationVar(&o.OutboxLag, "outbox-lag", doctorDefaults.OutboxLag, "report outbox topics whose oldest pending message is older than this")
	return cmd
}

// doctorDefaults are doctor's defaults, shown as the flags' defaults.
var doctorDefaults = doctor.Options{}.WithDefaults()
