package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Defaults and bounds of DeliveryRateOpts.
const (
	DefaultRateMinutes = 10
	MaxRateMinutes     = 60
	DefaultRateScan    = 50000
	MaxRateScan        = 1000000
)

// DeliveryRateOpts are the options of DeliveryRate. A nil *DeliveryRateOpts means the
// defaults.
type DeliveryRateOpts struct {
	// Minutes is the window: deliveries are counted per minute over the last Minutes
	// minutes. Default DefaultRateMinutes (10); 1..MaxRateMinutes.
	Minutes int
	// MaxScan is how many of the newest messages (by id) are read: the query's bound.
	// Default DefaultRateScan (50,000); 1..MaxRateScan.
	MaxScan int
}

// Deliveries is how many messages were delivered in each of the last minutes.
type Deliveries struct {
	// Topics holds the topics with deliveries in the window, in topic order.
	Topics []TopicDeliveries
	// Total is the deliveries of every topic per minute, oldest first (len Minutes).
	Total []int64
	// Scanned is how many messages were read. Complete reports that they were all the
	// outbox's messages, so the counts are exact; otherwise they are lower bounds: a
	// message older than the newest MaxScan (a backlog's) delivered in the window is not
	// counted.
	Scanned  int
	Complete bool
	// DBNow is the end of the window, by the database clock.
	DBNow time.Time
}

// TopicDeliveries is one topic's deliveries per minute.
type TopicDeliveries struct {
	Topic string
	// PerMinute[i] counts the deliveries in minute i of the window, oldest first: the last
	// element is the minute that ended at DBNow.
	PerMinute []int64
}

// DeliveryRate counts the deliveries of each topic in each of the last minutes, by the
// database clock, from the delivered messages not yet pruned (Message.DeliveredAt), in
// one statement. The outbox keeps no other history, and no index on delivery times: the
// statement reads only the newest DeliveryRateOpts.MaxScan messages by id, so its cost is
// bounded whatever the table's size, and its counts are exact only when the outbox holds
// no more messages than that (Deliveries.Complete). Options out of range return an
// error wrapping pgcoord.ErrInvalidArgument before any SQL runs.
func DeliveryRate(ctx context.Context, db pgcoord.DBTX, opts *DeliveryRateOpts) (Deliveries, error) {
	if err := check.DB(db); err != nil {
		return Deliveries{}, err
	}
	var o DeliveryRateOpts
	if opts != nil {
		o = *opts
	}
	if o.Minutes == 0 {
		o.Minutes = DefaultRateMinutes
	}
	if o.MaxScan == 0 {
		o.MaxScan = DefaultRateScan
	}
	if o.Minutes < 1 || o.Minutes > MaxRateMinutes {
		return Deliveries{}, check.Invalid("rate window of %d minutes is outside 1..%d", o.Minutes, MaxRateMinutes)
	}
	if o.MaxScan < 1 || o.MaxScan > MaxRateScan {
		return Deliveries{}, check.Invalid("rate scan of %d messages is outside 1..%d", o.MaxScan, MaxRateScan)
	}
	rows, err := queries.OutboxDeliveryRate(ctx, db, dbsqlc.OutboxDeliveryRateParams{
		MaxScan: int32(o.MaxScan), Minutes: int32(o.Minutes),
	})
	if err != nil {
		return Deliveries{}, fmt.Errorf("outbox: delivery rate: %w", err)
	}
	r := Deliveries{Total: make([]int64, o.Minutes), Topics: []TopicDeliveries{}}
	for _, row := range rows { // ordered by topic, oldest minute first
		r.Scanned, r.DBNow = int(row.Scanned), row.DbNow
		if row.Topic == "" || row.MinutesAgo < 0 || int(row.MinutesAgo) >= o.Minutes {
			continue // no deliveries at all (the query's one row then)
		}
		if n := len(r.Topics); n == 0 || r.Topics[n-1].Topic != row.Topic {
			r.Topics = append(r.Topics, TopicDeliveries{Topic: row.Topic, PerMinute: make([]int64, o.Minutes)})
		}
		i := o.Minutes - 1 - int(row.MinutesAgo)
		r.Topics[len(r.Topics)-1].PerMinute[i] = row.Delivered
		r.Total[i] += row.Delivered
	}
	r.Complete = r.Scanned < o.MaxScan
	return r, nil
}
