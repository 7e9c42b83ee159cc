package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/doctor"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// Behind PgBouncer in transaction mode a notification never reaches the listening client:
// notify needs attention and says why and what falls back, while the other database
// checks still answer.
func TestNotifyBehindPoolerNeedsAttention(t *testing.T) {
	pgtest.NeedsPooler(t)
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	byCheck := findings(t, ctx, func() ([]doctor.Finding, error) {
		return doctor.Run(ctx, pool, doctor.Options{NotifyTimeout: 500 * time.Millisecond})
	})
	n := byCheck["notify"]
	if n.Status != doctor.Attention || !strings.Contains(n.Summary, "a pooler stands between") || !strings.Contains(n.Explain, "only poll") {
		t.Fatalf("notify behind a pooler: %+v, want attention naming the pooler and saying waiting calls poll", n)
	}
	for _, c := range []string{"schema", "clock", "leases", "semaphores"} {
		if f := byCheck[c]; f.Status != doctor.OK {
			t.Errorf("%s behind a pooler: %+v, want ok", c, f)
		}
	}
}
