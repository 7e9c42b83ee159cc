package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// TestDeliveryRate: deliveries are counted per topic in the minute of the window they
// fell in, by the database clock (moved by the test); deliveries after the window's end, and
// pending and dead messages, are not; MaxScan bounds the read, and the counts then say
// they are lower bounds.
func TestDeliveryRate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	clock := pgtest.NewClock(t, pool)
	t0 := dbNow(t, pool).Add(time.Second)
	clock.Freeze(t0)
	relay := newRelay(t, pool, &recorder{fail: map[string]bool{"poison": true}}, outbox.Config{MaxAttempts: 1})
	enqueue(t, pool, msg("a", "1"), msg("b", "2"), outbox.Message{Topic: "u", Key: "x", Payload: []byte("3")}, msg("c", "poison"))
	runBatch(t, relay) // at T: t gets two, u one; poison goes dead
	clock.Advance(3 * time.Minute)
	enqueue(t, pool, msg("a", "4"), outbox.Message{Topic: "t", Key: "d", Payload: []byte("delayed"), Delay: time.Hour})
	runBatch(t, relay) // at T+3m: t gets one more; the delayed message stays pending

	rate := func(now time.Time, opts outbox.DeliveryRateOpts) outbox.Deliveries {
		t.Helper()
		clock.Freeze(now)
		r, err := outbox.DeliveryRate(ctx, pool, &opts)
		if err != nil {
			t.Fatal(err)
		}
		if !r.DBNow.Equal(now) {
			t.Fatalf("DBNow %v, want the database clock's %v", r.DBNow, now)
		}
		return r
	}
	r := rate(t0.Add(3*time.Minute+30*time.Second), outbox.DeliveryRateOpts{Minutes: 5})
	if len(r.Topics) != 2 || r.Topics[0].Topic != "t" || r.Topics[1].Topic != "u" || !r.Complete || r.Scanned != 6 {
		t.Fatalf("rate %+v: want topics t and u, all 6 messages scanned", r)
	}
	// Minute 4 (the last) ends at T+3m30s: the delivery at T+3m. Minute 1 holds T (3m30s ago).
	if want := []int64{0, 2, 0, 0, 1}; !slices.Equal(r.Topics[0].PerMinute, want) {
		t.Errorf("t per minute %v, want %v", r.Topics[0].PerMinute, want)
	}
	if want := []int64{0, 1, 0, 0, 0}; !slices.Equal(r.Topics[1].PerMinute, want) {
		t.Errorf("u per minute %v, want %v", r.Topics[1].PerMinute, want)
	}
	if want := []int64{0, 3, 0, 0, 1}; !slices.Equal(r.Total, want) {
		t.Errorf("total per minute %v, want %v", r.Total, want)
	}

	// A window ending at T+1m sees neither the later delivery nor anything before T-9m.
	if r := rate(t0.Add(time.Minute), outbox.DeliveryRateOpts{}); len(r.Total) != outbox.DefaultRateMinutes ||
		r.Total[outbox.DefaultRateMinutes-2] != 3 || sum(r.Total) != 3 {
		t.Errorf("window ending at T+1m: %v, want 3 deliveries a minute before its end", r.Total)
	}
	// Nothing in the window: no topics, zero counts, still the scan and the clock.
	if r := rate(t0.Add(time.Hour), outbox.DeliveryRateOpts{}); len(r.Topics) != 0 || sum(r.Total) != 0 || r.Scanned != 6 {
		t.Errorf("window an hour later: %+v, want no deliveries", r)
	}
	// MaxScan 2 reads the two newest messages only (the delayed one and the last
	// delivery): the counts are lower bounds.
	if r := rate(t0.Add(3*time.Minute+30*time.Second), outbox.DeliveryRateOpts{Minutes: 5, MaxScan: 2}); r.Complete ||
		r.Scanned != 2 || sum(r.Total) != 1 {
		t.Errorf("MaxScan 2: %+v, want 1 delivery counted, incomplete", r)
	}

	for _, bad := range []outbox.DeliveryRateOpts{{Minutes: -1}, {Minutes: outbox.MaxRateMinutes + 1}, {MaxScan: -5}, {MaxScan: outbox.MaxRateScan + 1}} {
		if _, err := outbox.DeliveryRate(ctx, noSQL{}, &bad); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("DeliveryRate(%+v) err = %v, want ErrInvalidArgument before any SQL", bad, err)
		}
	}
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

func ExampleDeliveryRate() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte("placed")})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	relay, _ := outbox.NewRelay(pool, &outbox.Config{Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error { return nil })})
	relay.RunBatch(ctx)

	// Deliveries per minute over the last 10 minutes, oldest first, by the database clock.
	rate, _ := outbox.DeliveryRate(ctx, pool, nil)
	for _, t := range rate.Topics {
		fmt.Println(t.Topic, t.PerMinute, "exact:", rate.Complete)
	}
	// Output:
	// orders [0 0 0 0 0 0 0 0 0 1] exact: true
}
