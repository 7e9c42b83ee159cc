package otelcoord_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/ratelimit"
)

// A rate limit call is one span named by its first limit, with the cost; a call refused
// by a policy that does not exist records the error; Reserve and Wait are traced too.
func TestRatelimitCallsTraced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	r := newRecorder(t)
	if _, err := ratelimit.Set(ctx, pool, ratelimit.Policy{Name: "api", Rate: 10, Period: time.Second, Burst: 5}); err != nil {
		t.Fatal(err)
	}
	opts := &ratelimit.Opts{Tracer: r.tracer}
	limits := []ratelimit.Limit{{Policy: "api", Key: "k1"}}
	if _, err := ratelimit.Allow(ctx, pool, 2, limits, opts); err != nil {
		t.Fatal(err)
	}
	s := r.one(t, "pgcoord.ratelimit.take")
	wantStatus(t, s, codes.Unset)
	wantAttrs(t, s, map[string]any{"pgcoord.ratelimit.policy": "api", "pgcoord.ratelimit.key": "k1", "pgcoord.ratelimit.cost": int64(2)})

	if _, err := ratelimit.Wait(ctx, pool, 1, limits, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := ratelimit.Allow(ctx, pool, 1, []ratelimit.Limit{{Policy: "gone", Key: "k"}}, opts); err == nil {
		t.Fatal("a call naming no policy succeeded")
	}
	ss := r.spans("pgcoord.ratelimit.take")
	if len(ss) != 3 {
		t.Fatalf("%d take spans, want 3 (Allow, Wait, the failed Allow)", len(ss))
	}
	wantStatus(t, ss[2], codes.Error)
}
