package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/partition"
)

// The partition groups' handoff scenarios (issue 31: from a member's death to the new
// owner's first accepted write, at most twice leases.handoff at c=1). Each worker runs a
// group of handoffPartitions partitions of its own, whose members heartbeat on a pool of
// the worker's own (partitionConns connections, one of them the pool's LISTEN session);
// the new owner's write goes through the worker's connection, as one statement on a ledger
// table whose fence guard (fenced.InstallGuard with a resource column) judges its token
// against the partition's fence register. An op records as its latency
// the handoff alone (recordLatency), from the death to the commit of the new owner's first
// write: the percentiles are handoffs. Its duration, and so ops/s and the ratio to
// leases.handoff, also counts what makes the next death possible (a replacement joining
// and taking its share): compare the p50s with leases.handoff's, not the ratio.
//
// partition.handoff, one op (members X and Y of equal weight, X holding partition 0 and Y
// partition 1):
//
//	X.Leave: its partition's context is cancelled, and one call removes X from the group,
//	   re-plans partition 0 to Y, grants it to Y under a new fence token and notifies
//	   <- the death
//	Y's member wakes on the notification and reads its grants: partition 0 (OnAssign)
//	the worker's connection writes the ledger row of partition 0 (fenced.Exec of one
//	   INSERT ... ON CONFLICT, which the guard judges against the partition's register);
//	   the write must be accepted and raise the row's token  <- recorded
//	a new member Z joins; Y is revoked partition 1 and releases it, which grants it to Z
//	   (OnAssign): Y holds partition 0 and Z partition 1, as X and Y did
//
// Each member lives two ops (joined, then survivor, then the death), so the notification
// that starts a handoff is at most the third that woke it: never one that the listener's
// spacing of frequent wake-ups (listen.WakeGap) would delay, which a survivor woken by every
// op of a long run would be.
//
// partition.handoff_expired, one op (a member S holding partition 0, its lease renewed):
//
//	a member D joins through the SQL API (pgcoord_partition_heartbeat, TTL
//	   partitionExpiryTTL); S is revoked partition 1 and releases it; D heartbeats until it
//	   is granted partition 1, and then stops: its lease and its grant expire together, at
//	   the expires_at of its last heartbeat (the database clock)  <- the death
//	S wakes when that lease expires (its heartbeats say when), heartbeats, re-plans
//	   (forgetting D) and is granted partition 1 under a new token (OnAssign)
//	the worker's connection writes partition 1's ledger row as above  <- recorded: from
//	   the expiry, on the local clock put on the database clock by an offset measured
//	   beforehand (the best of latenessClockSamples round trips)

const (
	// handoffPartitions is the size of a handoff scenario's group.
	handoffPartitions = 2
	// partitionConns is the size of a handoff worker's member pool.
	partitionConns = 4
	// partitionExpiryTTL is the lease of partition.handoff_expired's dying members.
	partitionExpiryTTL = 100 * time.Millisecond
	// partitionLedger is the table the new owners write, one row per group and partition.
	partitionLedger = "bench_partition_writes"
)

var partitionQueries dbsqlc.Queries

func init() {
	Register(Scenario{
		Name: "partition.handoff",
		Description: fmt.Sprintf("a member of a group of %d partitions (two members of equal weight, one partition each) "+
			"leaves (Member.Leave, which grants its partition to the other); latency is from the Leave call to the commit "+
			"of the other member's first write of the partition (one statement on the worker's connection, judged by a "+
			"fence guard against the partition's register with the new grant's token), after its read of its grants, "+
			"woken by the leave's notification; an op also has a replacement join and take its partition (so ops/s "+
			"counts whole cycles: compare p50 with leases.handoff's)", handoffPartitions),
		Floor:          "leases.handoff",
		Setup:          createPartitionLedger,
		NewWorker:      newPartitionHandoffWorker,
		MaxConcurrency: 1,
	})
	Register(Scenario{
		Name: "partition.handoff_expired",
		Description: fmt.Sprintf("in a group of %d partitions, a member joined through the SQL API with a %v TTL stops "+
			"heartbeating once granted its partition; latency is from its lease's expiry (database clock) to the commit of "+
			"the other member's first write of the partition (judged by the fence guard), after that "+
			"member woke at the expiry, re-planned and was granted it; an op also has the dying member join and take its "+
			"partition, and waits out its TTL (so ops/s counts whole cycles: compare p50 with leases.handoff's)",
			handoffPartitions, partitionExpiryTTL),
		Floor:          "leases.handoff",
		Setup:          createPartitionLedger,
		NewWorker:      newPartitionExpiryWorker,
		MaxConcurrency: 1,
	})
}

func createPartitionLedger(ctx context.Context, pool *pgxpool.Pool) error {
	// Both scenarios' Setup: whichever runs second finds it.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+partitionLedger+` (
		grp         text,
		partition   int,
		resource    text NOT NULL,
		fence_token bigint NOT NULL,
		writes      bigint NOT NULL,
		PRIMARY KEY (grp, partition)
	)`); err != nil {
		return err
	}
	// Every write of a row must pass the fence register of its partition's resource.
	return fenced.InstallGuard(ctx, pool, partitionLedger, "fence_token", &fenced.GuardOpts{ResourceColumn: "resource"})
}

// ledgerWrite records a write of a partition under a token, as one statement that the
// guard judges: it changes no row unless the token is higher than the last write's.
const ledgerWrite = `INSERT INTO ` + partitionLedger + ` AS w (grp, partition, resource, fence_token, writes) VALUES ($1, $2, $3, $4, 1)
ON CONFLICT (grp, partition) DO UPDATE SET fence_token = excluded.fence_token, writes = w.writes + 1
	WHERE w.fence_token < excluded.fence_token`

// assignment is a partition granted to a member, as its OnAssign saw it.
type assignment struct {
	member string
	p      partition.Partition
}

// partitionGroup is a handoff worker's group, its members' pool and what they were granted.
type partitionGroup struct {
	scenario string
	w        Worker
	pool     *pgxpool.Pool
	name     string
	assigned chan assignment
	seq      int
	members  map[string]*partition.Member // live, to leave at the end
}

// newPartitionGroup opens the pool of a worker's group.
func newPartitionGroup(ctx context.Context, scenario string, w Worker) (*partitionGroup, error) {
	cfg, err := connPoolConfig(w.Conn.Conn())
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", scenario, err)
	}
	cfg.MaxConns = partitionConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", scenario, err)
	}
	name, err := uniqueLeaseName(scenario, w)
	if err != nil {
		pool.Close()
		return nil, err
	}
	g := &partitionGroup{scenario: scenario, w: w, pool: pool, name: name,
		assigned: make(chan assignment, 2*handoffPartitions), members: map[string]*partition.Member{}}
	w.Cleanup(g.close)
	return g, nil
}

// close makes the live members leave (see leave) and closes their pool.
func (g *partitionGroup) close() {
	ctx, cancel := context.WithTimeout(context.Background(), handoffPatience)
	defer cancel()
	for _, m := range g.members {
		_ = g.leave(ctx, m) // best effort: the bench schema goes anyway
	}
	g.pool.Close()
}

// join makes a new member join the group (creating it if needed).
func (g *partitionGroup) join(ctx context.Context) (*partition.Member, error) {
	g.seq++
	name := "m" + strconv.Itoa(g.seq)
	m, err := partition.Join(ctx, g.pool, g.name, &partition.Options{
		Partitions: handoffPartitions, Member: name, TTL: benchTTL,
		OnAssign: func(p partition.Partition) {
			select {
			case g.assigned <- assignment{name, p}:
			case <-p.Context.Done():
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("bench: %s: join: %w", g.scenario, err)
	}
	g.members[name] = m
	return m, nil
}

// leave makes m leave the group.
func (g *partitionGroup) leave(ctx context.Context, m *partition.Member) error {
	delete(g.members, m.Name())
	if err := m.Leave(ctx); err != nil {
		return fmt.Errorf("bench: %s: %w", g.scenario, err)
	}
	return nil
}

// await waits for a grant of partition id to member under a token above after, passing
// over earlier grants of it (under a lower token); a grant of anything else fails.
func (g *partitionGroup) await(ctx context.Context, member string, id int, after int64) (partition.Partition, error) {
	timer := time.NewTimer(handoffPatience)
	defer timer.Stop()
	for {
		select {
		case a := <-g.assigned:
			if a.member != member || a.p.ID != id {
				return partition.Partition{}, fmt.Errorf("bench: %s: partition %d was granted to %s, want partition %d to %s",
					g.scenario, a.p.ID, a.member, id, member)
			}
			if a.p.Token > after {
				return a.p, nil
			}
		case <-timer.C:
			return partition.Partition{}, fmt.Errorf("bench: %s: partition %d not granted to %s within %v", g.scenario, id, member, handoffPatience)
		case <-ctx.Done():
			return partition.Partition{}, ctx.Err()
		}
	}
}

// write is the new owner's first write of p: its ledger row, in one statement of its own
// (fenced.Exec) that the table's guard judges against the partition's fence register with
// the grant's token; it must be accepted and raise the row's token.
func (g *partitionGroup) write(ctx context.Context, p partition.Partition) error {
	_, err := fenced.Exec(ctx, g.w.Conn, ledgerWrite, p.Group, p.ID, p.Resource(), p.Token)
	if errors.Is(err, fenced.ErrStale) {
		return fmt.Errorf("bench: %s: the write of %s under its new grant's token %d was refused, or not above the last write's: %w",
			g.scenario, p.Resource(), p.Token, err)
	}
	if err != nil {
		return fmt.Errorf("bench: %s: write: %w", g.scenario, err)
	}
	return nil
}

// partition.handoff

type partitionHandoff struct {
	g        *partitionGroup
	dying    *partition.Member // holds partition 0
	survivor *partition.Member // holds partition 1
}

func newPartitionHandoffWorker(ctx context.Context, w Worker) (Op, error) {
	g, err := newPartitionGroup(ctx, "partition.handoff", w)
	if err != nil {
		return nil, err
	}
	h := &partitionHandoff{g: g}
	// The first member takes both partitions, the second partition 1 from it.
	if h.dying, err = g.join(ctx); err != nil {
		return nil, err
	}
	for id := range handoffPartitions {
		if _, err := g.await(ctx, h.dying.Name(), id, 0); err != nil {
			return nil, err
		}
	}
	if err := h.replace(ctx); err != nil {
		return nil, err
	}
	return h.op, nil
}

// replace has a new member join and take partition 1 from the survivor, which becomes the
// next to die.
func (h *partitionHandoff) replace(ctx context.Context) error {
	m, err := h.g.join(ctx)
	if err != nil {
		return err
	}
	if _, err := h.g.await(ctx, m.Name(), 1, 0); err != nil {
		return err
	}
	if h.survivor != nil {
		h.dying = h.survivor
	}
	h.survivor = m
	return nil
}

func (h *partitionHandoff) op(ctx context.Context) error {
	start := time.Now()
	if err := h.g.leave(ctx, h.dying); err != nil {
		return err
	}
	p, err := h.g.await(ctx, h.survivor.Name(), 0, 0)
	if err != nil {
		return err
	}
	if err := h.g.write(ctx, p); err != nil {
		return err
	}
	recordLatency(ctx, time.Since(start))
	return h.replace(ctx)
}

// partition.handoff_expired

type partitionExpiry struct {
	g        *partitionGroup
	survivor *partition.Member
	offset   time.Duration // the database clock minus the local one
}

func newPartitionExpiryWorker(ctx context.Context, w Worker) (Op, error) {
	g, err := newPartitionGroup(ctx, "partition.handoff_expired", w)
	if err != nil {
		return nil, err
	}
	h := &partitionExpiry{g: g}
	if h.offset, err = dbClockOffset(ctx, w.Conn); err != nil {
		return nil, fmt.Errorf("bench: partition.handoff_expired: %w", err)
	}
	if h.survivor, err = g.join(ctx); err != nil {
		return nil, err
	}
	for id := range handoffPartitions {
		if _, err := g.await(ctx, h.survivor.Name(), id, 0); err != nil {
			return nil, err
		}
	}
	return h.op, nil
}

func (h *partitionExpiry) op(ctx context.Context) error {
	h.g.seq++
	dying := "d" + strconv.Itoa(h.g.seq)
	// It joins, and heartbeats until the survivor released partition 1 to it.
	deadline := time.Now().Add(handoffPatience)
	var (
		death time.Time
		token int64 // its grant's
	)
	for join := true; ; join = false {
		r, err := partitionQueries.PartitionHeartbeat(ctx, h.g.w.Conn, dbsqlc.PartitionHeartbeatParams{
			GroupName: h.g.name, Member: dying, Weight: 1, Ttl: dbarg.Interval(partitionExpiryTTL),
			Release: []int32{}, Joining: join,
		})
		if err != nil {
			return fmt.Errorf("bench: partition.handoff_expired: heartbeat of %s: %w", dying, err)
		}
		if slices.Equal(r.Owned, []int32{1}) {
			death, token = r.ExpiresAt, r.Tokens[0]
			break
		}
		if len(r.Owned) != 0 || time.Now().After(deadline) {
			return fmt.Errorf("bench: partition.handoff_expired: %s holds %v, want partition 1 within %v", dying, r.Owned, handoffPatience)
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// It stops: the survivor takes its partition at the expiry. (If a pause of this
	// process let its lease lapse while it waited, the survivor took the partition back
	// meanwhile, under a token below its grant's: passed over.)
	p, err := h.g.await(ctx, h.survivor.Name(), 1, token)
	if err != nil {
		return err
	}
	if err := h.g.write(ctx, p); err != nil {
		return err
	}
	recordLatency(ctx, time.Now().Add(h.offset).Sub(death))
	return nil
}
