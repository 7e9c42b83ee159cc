//go:build unix

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/partition"
)

// The partition workload of the fault and HA suites: every fault worker is a member of one
// partition group and writes the partitions it owns under their grants' fence tokens, and
// the checks judge the writes the database accepted, in commit order: no partition ever had
// two owners.

const (
	faultPartGroup = "fault-parts"
	faultPartCount = 16
	// The shortest lease a member may have: a pause of a worker outlasts it, and its
	// partitions move while it sleeps. On a machine loaded to 10x its cores (other suites
	// beside this one) heartbeats took 1-6 s here, longer than the TTL: the group then
	// churns, every member's grants expiring before its next heartbeat — more moves for
	// the checks to judge, and fewer writes (32 in 24 s instead of about 60 a second).
	faultPartTTL = partition.MinTTL
	// How long a Join may take: longer than a statement (faultOpTimeout), still bounded.
	faultPartJoinTimeout = 30 * time.Second
)

// faultPartitionTables: fault_partition has a row per partition that each write updates;
// the row lock orders a partition's writes, so its trigger logs them in fault_partition_log
// in commit order, each with the partition's newest grant as the writing transaction saw
// it after its write (a fresh snapshot: a volatile function's statement). A second trigger
// logs every grant of a partition, and whether the grant before it was still live then, by
// the database clock.
var faultPartitionTables = fmt.Sprintf(`
CREATE TABLE fault_partition (partition integer PRIMARY KEY, token bigint NOT NULL DEFAULT 0, member text, write_id text);
INSERT INTO fault_partition (partition) SELECT i FROM generate_series(0, %[2]d - 1) AS i;
CREATE TABLE fault_partition_log (id bigserial PRIMARY KEY, partition integer NOT NULL, token bigint NOT NULL,
	member text NOT NULL, write_id text NOT NULL, newest_grant bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION fault_partition_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO fault_partition_log (partition, token, member, write_id, newest_grant)
	VALUES (NEW.partition, NEW.token, NEW.member, NEW.write_id,
	        coalesce((SELECT p.fence_token FROM pgcoord_partitions p WHERE p.group_name = '%[1]s' AND p.partition = NEW.partition), 0));
	RETURN NULL;
END $$;
CREATE TRIGGER fault_partition_logged AFTER UPDATE ON fault_partition FOR EACH ROW EXECUTE FUNCTION fault_partition_logged();
CREATE TABLE fault_partition_grants (id bigserial PRIMARY KEY, partition integer NOT NULL, holder text NOT NULL,
	token bigint NOT NULL, at timestamptz NOT NULL, prev_holder text, prev_token bigint NOT NULL, prev_live boolean NOT NULL);
CREATE FUNCTION fault_partition_granted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO fault_partition_grants (partition, holder, token, at, prev_holder, prev_token, prev_live)
	VALUES (NEW.partition, NEW.holder, NEW.fence_token, NEW.acquired_at, OLD.holder, OLD.fence_token,
	        OLD.holder IS NOT NULL AND OLD.expires_at > NEW.acquired_at);
	RETURN NULL;
END $$;
CREATE TRIGGER fault_partition_granted AFTER UPDATE OF fence_token ON pgcoord_partitions FOR EACH ROW
	WHEN (NEW.group_name = '%[1]s' AND NEW.fence_token IS DISTINCT FROM OLD.fence_token AND NEW.holder IS NOT NULL)
	EXECUTE FUNCTION fault_partition_granted();`, faultPartGroup, faultPartCount)

// faultPartitionLoop joins the partition group as a member named like the worker and, every
// few tens of milliseconds, writes one of the partitions it owns under the grant's token:
// even partitions through fenced.Check(p.Resource(), p.Token), odd ones through
// Member.Check. One way per partition, as an application would: Member.Check does not read
// the fence register, so after an asynchronous failover lost a grant, mixing the two on one
// partition could accept a write under the lost grant's token (through the fence) and then
// one under the surviving older grant's (through Member.Check). One write in eight goes to a partition the member was granted before, whether it
// still owns it or not: a stale write the fence must refuse, as a member that wakes from a
// pause makes. Each write updates the partition's row of fault_partition, which logs it
// (faultPartitionTables), and says "pw <id> ok" or "pw <id> stale" once it knows the
// outcome. FENCING=off writes without either check.
func faultPartitionLoop(ctx context.Context, w *workerproc.Worker, name string, rng *rand.Rand) {
	unfenced := w.Param("FENCING") == "off"
	var m *partition.Member
	for m == nil {
		// Join creates the group, listens and heartbeats: on a loaded machine that takes more
		// than faultOpTimeout, and a Join cut short leaves a member (and maybe grants) to
		// expire unused.
		jctx, cancel := context.WithTimeout(ctx, faultPartJoinTimeout)
		err := func(ctx context.Context) (err error) {
			m, err = partition.Join(ctx, w.Pool, faultPartGroup, &partition.Options{Partitions: faultPartCount, Member: name,
				TTL: faultPartTTL, Logger: slog.New(heartbeatFailures{w})})
			return err
		}(jctx)
		cancel()
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			sleepRand(ctx, rng, 100*time.Millisecond)
		}
	}
	if m == nil {
		return
	}
	defer func() { _ = withTimeout(context.WithoutCancel(ctx), m.Leave) }()
	known := map[int]partition.Partition{} // the latest grant of each partition the member was given
	for seq := 1; ctx.Err() == nil; seq++ {
		sleepRand(ctx, rng, 80*time.Millisecond) // the work; a pause here outlasts the grant
		owned := m.Owned()
		for _, p := range owned {
			known[p.ID] = p
		}
		var p partition.Partition
		switch {
		case len(owned) > 0 && rng.IntN(8) > 0:
			p = owned[rng.IntN(len(owned))]
		case len(known) > 0:
			ids := slices.Sorted(maps.Keys(known))
			p = known[ids[rng.IntN(len(ids))]]
		default:
			continue
		}
		id := fmt.Sprintf("%s-p%d", name, seq)
		err := withTimeout(ctx, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
				var err error
				switch {
				case unfenced:
				case p.ID%2 == 0:
					err = fenced.Check(ctx, tx, p.Resource(), p.Token)
				default:
					err = m.Check(ctx, tx, p)
				}
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE fault_partition SET token = $2, member = $3, write_id = $4 WHERE partition = $1`,
					p.ID, p.Token, name, id)
				return err
			})
		})
		switch {
		case err == nil:
			w.Say("pw %s ok", id)
		case errors.Is(err, fenced.ErrStale), errors.Is(err, partition.ErrRevoked):
			w.Say("pw %s stale", id)
		case ctx.Err() == nil:
			// The outcome is unknown (the commit may have happened): counted, for a run
			// whose partition workload did nothing.
			w.Say("perr write %s", errorClass(err))
		}
	}
}

// heartbeatFailures is a member's logger: it tells the history each failed heartbeat's
// errorClass ("perr heartbeat <class>"), and drops the rest.
type heartbeatFailures struct{ w *workerproc.Worker }

func (heartbeatFailures) Enabled(context.Context, slog.Level) bool { return true }
func (h heartbeatFailures) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h heartbeatFailures) WithGroup(string) slog.Handler          { return h }

func (h heartbeatFailures) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "err" {
			h.w.Say("perr heartbeat %s", errorClass(err))
		}
		return true
	})
	return nil
}

// checkPartitions checks the partition group's history on the database the run ended on:
//
//   - partition-token-order: a partition's accepted writes, in commit order, never go to a
//     lower token, and neither do its grants;
//   - partition-two-owners: no write was accepted under a token older than a grant of its
//     partition that had committed before the write's last statement; no grant was made
//     while the one before it was live by the database clock; no token was granted twice;
//   - partition-grant-lost: every accepted write was made under a grant the database has
//     (to the writer, of that partition, with that token);
//   - partition-write-lost: every write a worker was told committed is there.
//
// An asynchronous failover may lose acknowledged grants and writes, and with them the
// last two; the first must hold even then (tokens never go backwards: the timeline floor).
func (h *faultHarness) checkPartitions(hist *faultHistory) {
	var writes, grants, owners, members int
	if err := h.admin.QueryRow(h.ctx, `SELECT (SELECT count(*) FROM fault_partition_log), (SELECT count(*) FROM fault_partition_grants),
			(SELECT count(DISTINCT token) FROM fault_partition_log), (SELECT count(DISTINCT holder) FROM fault_partition_grants)`).
		Scan(&writes, &grants, &owners, &members); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("partitions: %d writes acknowledged, %d refused as stale; %d committed under %d of %d grants to %d members; per timeline of the grant: %s",
		len(hist.partOK), hist.partStale, writes, owners, grants, members,
		strings.Join(h.queryStrings(`SELECT format('%s: %s writes', tl, count(*)) FROM
			(SELECT (token >> 44) + 1 AS tl FROM fault_partition_log) l GROUP BY tl ORDER BY tl`), ", "))
	if len(hist.partOK) == 0 {
		h.t.Error("no partition write was accepted: the workload did nothing")
	}
	if hist.partStale == 0 && !h.unfenced {
		h.t.Log("no stale partition write was refused: the fence was not put to the test in this run")
	}

	if v := h.queryStrings(`SELECT format('partition %s: a write with token %s (%s) committed after one with token %s (%s)',
			partition, token, member, prev, prev_member)
		FROM (SELECT partition, token, member, lag(token) OVER w AS prev, lag(member) OVER w AS prev_member
		        FROM fault_partition_log WINDOW w AS (PARTITION BY partition ORDER BY id)) l
		WHERE token < prev ORDER BY partition`); len(v) > 0 {
		h.violated("partition-token-order", "%d partition writes committed with a lower token than the write before them: %s", len(v), firstFew(v))
	}
	if v := h.queryStrings(`SELECT format('partition %s: granted to %s with token %s after token %s',
			partition, holder, token, prev)
		FROM (SELECT partition, holder, token, lag(token) OVER (PARTITION BY partition ORDER BY id) AS prev FROM fault_partition_grants) g
		WHERE token < prev ORDER BY partition`); len(v) > 0 {
		h.violated("partition-token-order", "%d partition grants with a lower token than the grant before them: %s", len(v), firstFew(v))
	}

	if v := h.queryStrings(`SELECT format('partition %s: %s wrote with token %s at %s, after the grant of token %s',
			partition, member, token, at, newest_grant)
		FROM fault_partition_log WHERE newest_grant > token ORDER BY id`); len(v) > 0 {
		h.violated("partition-two-owners", "%d partition writes accepted with an older token after a newer grant of their partition: %s", len(v), firstFew(v))
	}
	if v := h.queryStrings(`SELECT format('partition %s: granted to %s (token %s) at %s while %s''s grant (token %s) was live',
			partition, holder, token, at, prev_holder, prev_token)
		FROM fault_partition_grants WHERE prev_live ORDER BY id`); len(v) > 0 {
		h.violated("partition-two-owners", "%d partition grants made while the grant before them was live: %s", len(v), firstFew(v))
	}
	if v := h.queryStrings(`SELECT format('token %s granted %s times', token, count(*))
		FROM fault_partition_grants GROUP BY token HAVING count(*) > 1`); len(v) > 0 {
		h.violated("partition-two-owners", "%d partition tokens granted more than once: %s", len(v), firstFew(v))
	}

	if v := h.queryStrings(`SELECT format('partition %s: %s wrote %s times with token %s', partition, member, count(*), token)
		FROM fault_partition_log l
		WHERE NOT EXISTS (SELECT FROM fault_partition_grants g WHERE g.partition = l.partition AND g.token = l.token AND g.holder = l.member)
		GROUP BY partition, member, token`); len(v) > 0 {
		h.violated("partition-grant-lost", "%d grants that partition writes were accepted under are not on the database: %s", len(v), firstFew(v))
	}

	kept := map[string]bool{}
	for _, id := range h.queryStrings(`SELECT write_id FROM fault_partition_log`) {
		kept[id] = true
	}
	var lost []string
	for _, id := range hist.partOK {
		if !kept[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		h.violated("partition-write-lost", "%d acknowledged partition writes are not on the database (%s ...)",
			len(lost), strings.Join(lost[:min(5, len(lost))], ", "))
	}
}

// queryStrings returns the rows of a query of one text column.
func (h *faultHarness) queryStrings(sql string) []string {
	h.t.Helper()
	rows, err := h.admin.Query(h.ctx, sql)
	if err != nil {
		h.t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return all
}

// firstFew joins the first few of rows, for a message.
func firstFew(rows []string) string {
	s := strings.Join(rows[:min(len(rows), 5)], "; ")
	if len(rows) > 5 {
		s += "; ..."
	}
	return s
}

// partitionWriteAfterNewerGrant reports whether a partition write was accepted with an
// older token than a grant of its partition that had committed before it.
func (h *faultHarness) partitionWriteAfterNewerGrant() bool {
	var found bool
	if err := h.admin.QueryRow(h.ctx, `SELECT EXISTS (SELECT FROM fault_partition_log WHERE newest_grant > token)`).Scan(&found); err != nil {
		h.t.Fatal(err)
	}
	return found
}
