package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
)

// BenchmarkRelays drains a standing backlog of 200,000 messages with 1, 2, 4 and 8 relays
// in one process (claims of up to 1,000, a no-op handler), spread over 20,000 keys (10
// messages each) and over 200,000 (one each). An op is 1,000 messages delivered; it
// reports msgs/s (all relays together) and msgs/claim (what a claim returned, on average).
// Adding relays must not lower msgs/s, and msgs/claim stays near 1,000:
//
//	go test -run '^$' -bench Relays -benchtime 3s ./outbox
func BenchmarkRelays(b *testing.B) {
	const backlog, batch = 200000, 1000
	pool := pgtest.PoolMax(b, 20)
	ctx := b.Context()
	for _, keys := range []int{20000, 200000} {
		for _, relays := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("keys=%d/relays=%d", keys, relays), func(b *testing.B) {
				// The backlog, and enough behind it for b.N ops: plain rows in one statement
				// (no Enqueue lock per key), vacuumed and analyzed as autovacuum would.
				for _, sql := range []string{`TRUNCATE pgcoord_outbox`,
					fmt.Sprintf(`INSERT INTO pgcoord_outbox (topic, key, payload)
					             SELECT 't', 'k' || (g %% %d), '{}' FROM generate_series(1, %d) g`, keys, backlog+b.N*batch),
					`VACUUM ANALYZE pgcoord_outbox`} {
					if _, err := pool.Exec(ctx, sql); err != nil {
						b.Fatal(err)
					}
				}
				var rs []*outbox.Relay
				for i := range relays {
					r, err := outbox.NewRelay(pool, &outbox.Config{
						Handler:   outbox.HandlerFunc(func(context.Context, outbox.Message) error { return nil }),
						BatchSize: batch, Claimant: fmt.Sprint("bench-", i),
					})
					if err != nil {
						b.Fatal(err)
					}
					rs = append(rs, r)
				}
				var delivered atomic.Int64
				want := int64(b.N * batch)
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for _, r := range rs {
					wg.Go(func() {
						for delivered.Load() < want {
							n, err := r.RunBatch(ctx)
							if err != nil {
								b.Error(err)
								return
							}
							delivered.Add(int64(n))
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				var claims, claimed int64
				for _, r := range rs {
					s := r.Stats()
					claims, claimed = claims+s.Claims, claimed+s.Claimed
					if err := r.Leave(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(delivered.Load())/elapsed.Seconds(), "msgs/s")
				b.ReportMetric(float64(claimed)/float64(max(claims, 1)), "msgs/claim")
			})
		}
	}
}
