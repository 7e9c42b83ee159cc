package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/partition"
)

// RelayPartitions is how many partitions the relays' group of a topic set has when the
// first relay creates it (see "Several relays" in the package documentation). An operator
// may resize it (`pgcoord partitions resize`); keep it at most 1024, the number of buckets:
// with more, some partitions cover no bucket, and a relay given only those delivers
// nothing.
const RelayPartitions = 64

// GroupName is the partition group through which the relays of topics (none: every topic)
// share the keys: "outbox"; or "outbox:" followed by the distinct topics, sorted and joined
// by commas, when no topic holds a comma and that fits partition.MaxGroupLen; else
// "outbox#" followed by the first 32 hex digits of the SHA-256 of the topics, each
// followed by a zero byte. So two topic sets never share a group.
func GroupName(topics []string) string {
	if len(topics) == 0 {
		return "outbox"
	}
	ts := slices.Clone(topics)
	slices.Sort(ts)
	ts = slices.Compact(ts)
	name := "outbox:" + strings.Join(ts, ",")
	if len(name) <= partition.MaxGroupLen && !slices.ContainsFunc(ts, func(t string) bool { return strings.Contains(t, ",") }) {
		return name
	}
	h := sha256.New()
	for _, t := range ts {
		h.Write([]byte(t))
		h.Write([]byte{0})
	}
	return "outbox#" + hex.EncodeToString(h.Sum(nil)[:16])
}

// memberTTL is the relay's lease in its group: its claims' TTL, at most
// partition.DefaultTTL (a relay with long claims that dies hands its partitions on sooner
// than its claims expire) and at least partition.MinTTL.
func (r *Relay) memberTTL() time.Duration {
	return max(min(r.cfg.ClaimTTL, partition.DefaultTTL), partition.MinTTL)
}

// join returns the relay's membership of its group, joining it (and creating the group
// with RelayPartitions partitions if it does not exist) on the first call after NewRelay or
// Leave; nil while a Leave is under way (a member that joined again then would take the
// leaving one's place, and the leave would remove it).
func (r *Relay) join(ctx context.Context) (*partition.Member, error) {
	r.gmu.Lock()
	defer r.gmu.Unlock()
	if r.leaving {
		return nil, nil
	}
	if r.member != nil {
		return r.member, nil
	}
	o := partition.Options{
		Member: r.cfg.Claimant, TTL: r.memberTTL(), RevokeGrace: r.memberTTL(), Logger: r.cfg.Logger,
		OnAssign: func(partition.Partition) {
			select {
			case r.assigned <- struct{}{}:
			default:
			}
		},
		OnRevoke: func(ctx context.Context, _ partition.Partition) { r.awaitBatches(ctx) },
	}
	m, err := partition.Join(ctx, r.pool, r.group, &o)
	if errors.Is(err, partition.ErrUnknownGroup) {
		o.Partitions = RelayPartitions
		m, err = partition.Join(ctx, r.pool, r.group, &o)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: relay %s joins %q: %w", r.cfg.Claimant, r.group, err)
	}
	r.member = m
	return m, nil
}

// ranBatch notes a batch's end. A relay driven by RunBatch alone (not running) leaves its
// group once it has made no batch for its lease (leaveIfIdle): an abandoned Relay does not
// hold its partitions, heartbeating, for the life of the process.
func (r *Relay) ranBatch() {
	r.gmu.Lock()
	defer r.gmu.Unlock()
	r.lastBatch = time.Now()
	if r.idle == nil && r.member != nil && !r.running.Load() {
		r.idle = time.AfterFunc(r.memberTTL(), r.leaveIfIdle)
	}
}

// leaveIfIdle leaves the group if the relay is not running and made no batch for its lease,
// and otherwise looks again when that may be so.
func (r *Relay) leaveIfIdle() {
	r.gmu.Lock()
	r.idle = nil
	wait := r.memberTTL() - time.Since(r.lastBatch)
	if r.member == nil || r.running.Load() {
		r.gmu.Unlock()
		return
	}
	if wait > 0 {
		r.idle = time.AfterFunc(wait, r.leaveIfIdle)
		r.gmu.Unlock()
		return
	}
	r.gmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.memberTTL()+5*time.Second)
	defer cancel()
	if err := r.Leave(ctx); err != nil {
		r.cfg.Logger.Warn("outbox: an idle relay cannot leave its partition group; the others take its partitions when its lease expires",
			"claimant", r.cfg.Claimant, "error", err)
	}
}

// startBatch registers a batch before it reads the relay's partitions, so that a revoke
// after that read waits for the batch (awaitBatches); the batch calls the returned function
// when its outcomes are recorded.
func (r *Relay) startBatch() (end func()) {
	done := make(chan struct{})
	r.mu.Lock()
	r.batches[done] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.batches, done)
		r.mu.Unlock()
		close(done)
	}
}

// awaitBatches waits, until ctx ends, for the batches under way: a revoked partition is
// released to its next holder only after the claims that may hold its keys are settled.
// (Batches started later no longer claim it: it has left Member.Owned.)
func (r *Relay) awaitBatches(ctx context.Context) {
	r.mu.Lock()
	var under []chan struct{}
	for c := range r.batches {
		under = append(under, c)
	}
	r.mu.Unlock()
	for _, c := range under {
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
}
