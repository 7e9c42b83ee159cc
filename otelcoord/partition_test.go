package otelcoord_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/partition"
)

// A member's heartbeats are spans naming the group and the member, with how many
// partitions it holds after each and how many the heartbeat granted.
func TestPartitionHeartbeat(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	m, err := partition.Join(t.Context(), pool, "shards", &partition.Options{Partitions: 4, Member: "w1", Tracer: r.tracer})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(context.Background()) }()
	beat := r.waitSpans(t, "pgcoord.partition.heartbeat", 1)[0]
	wantStatus(t, beat, codes.Unset)
	wantAttrs(t, beat, map[string]any{"pgcoord.partition.group": "shards", "pgcoord.holder": "w1",
		"pgcoord.partition.owned": int64(4), "pgcoord.partition.granted": int64(4), "pgcoord.partition.revoked": int64(0)})
}
