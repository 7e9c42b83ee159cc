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
// may resize it (`pgcoord partitions resize`); partitions beyond 1024 are given no keys.
const RelayPartitions = 64

// GroupName is the partition group through which the relays of topics (none: every topic)
// share the keys: "outbox", or "outbox:" followed by the distinct topics, sorted and
// joined by commas (or, when that is longer than partition.MaxGroupLen, by the first 32 hex
// digits of its SHA-256).
func GroupName(topics []string) string {
	if len(topics) == 0 {
		return "outbox"
	}
	ts := slices.Clone(topics)
	slices.Sort(ts)
	name := "outbox:" + strings.Join(slices.Compact(ts), ",")
	if len(name) > partition.MaxGroupLen {
		sum := sha256.Sum256([]byte(name))
		name = "outbox:" + hex.EncodeToString(sum[:16])
	}
	return name
}

// memberTTL is the relay's lease in its group: its claims' TTL (at least partition.MinTTL),
// so a relay that dies hands its keys on when its last claim has expired too.
func (r *Relay) memberTTL() time.Duration { return max(r.cfg.ClaimTTL, partition.MinTTL) }

// join returns the relay's membership of its group, joining it (and creating the group
// with RelayPartitions partitions if it does not exist) on the first call after NewRelay or
// Leave.
func (r *Relay) join(ctx context.Context) (*partition.Member, error) {
	r.gmu.Lock()
	defer r.gmu.Unlock()
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
