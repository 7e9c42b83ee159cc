package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/semaphore"
)

// noSQL is a database handle that fails the test if any statement is sent to it.
type noSQL struct{ t *testing.T }

func (d noSQL) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	d.t.Error("a statement was sent despite bad input")
	return pgconn.CommandTag{}, errors.New("no SQL")
}

func (d noSQL) Query(context.Context, string, ...any) (pgx.Rows, error) {
	d.t.Error("a query was sent despite bad input")
	return nil, errors.New("no SQL")
}

func (d noSQL) QueryRow(context.Context, string, ...any) pgx.Row {
	d.t.Error("a query was sent despite bad input")
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errors.New("no SQL") }

// Bad input is refused with ErrInvalidName or ErrInvalidArgument before any SQL runs.
func TestBadInputIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	db := noSQL{t}
	var nilPool *pgxpool.Pool
	good := semaphore.Permit{Key: "k", Holder: "h", Token: 1}
	long := strings.Repeat("x", pgcoord.MaxNameLen+1)
	cases := []struct {
		name string
		want error
		call func() error
	}{
		{"empty key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.TryAcquire(ctx, db, "", 1, time.Second, nil); return err }},
		{"long key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.TryAcquire(ctx, db, long, 1, time.Second, nil); return err }},
		{"NUL in key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.TryAcquire(ctx, db, "a\x00b", 1, time.Second, nil); return err }},
		{"invalid UTF-8", pgcoord.ErrInvalidName, func() error { _, err := semaphore.Get(ctx, db, "\xff"); return err }},
		{"limit 0", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, db, "k", 0, time.Second, nil); return err }},
		{"limit too big", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.TryAcquire(ctx, db, "k", semaphore.MaxLimit+1, time.Second, nil)
			return err
		}},
		{"ttl 0", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, db, "k", 1, 0, nil); return err }},
		{"ttl below 1ms", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, db, "k", 1, time.Microsecond, nil); return err }},
		{"ttl over 24h", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, db, "k", 1, 25*time.Hour, nil); return err }},
		{"negative ttl", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Next(ctx, db, -time.Second, nil); return err }},
		{"long holder", pgcoord.ErrInvalidName, func() error {
			_, err := semaphore.TryAcquire(ctx, db, "k", 1, time.Second, &semaphore.AcquireOpts{Holder: long})
			return err
		}},
		{"margin = ttl", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.TryAcquire(ctx, db, "k", 1, time.Second, &semaphore.AcquireOpts{SafetyMargin: time.Second})
			return err
		}},
		{"sync commit local", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.TryAcquire(ctx, db, "k", 1, time.Second, &semaphore.AcquireOpts{SyncCommit: "local"})
			return err
		}},
		{"Next sync commit off", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.Next(ctx, db, time.Second, &semaphore.NextOpts{SyncCommit: "off"})
			return err
		}},
		{"negative poll", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.TryAcquire(ctx, db, "k", 1, time.Second, &semaphore.AcquireOpts{PollInterval: -1})
			return err
		}},
		{"nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, nil, "k", 1, time.Second, nil); return err }},
		{"typed nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.TryAcquire(ctx, nilPool, "k", 1, time.Second, nil); return err }},
		{"nil pool", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Acquire(ctx, nil, "k", 1, time.Second, nil); return err }},
		{"Acquire bad key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.Acquire(ctx, nilPool, "", 1, time.Second, nil); return err }},
		{"Renew bad ttl", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Renew(ctx, db, good, 0, nil); return err }},
		{"Renew bad margin", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.Renew(ctx, db, good, time.Second, &semaphore.RenewOpts{SafetyMargin: -1})
			return err
		}},
		{"Renew empty permit", pgcoord.ErrInvalidName, func() error { _, err := semaphore.Renew(ctx, db, semaphore.Permit{}, time.Second, nil); return err }},
		{"Renew nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Renew(ctx, nilPool, good, time.Second, nil); return err }},
		{"Release empty permit", pgcoord.ErrInvalidName, func() error { return semaphore.Release(ctx, db, semaphore.Permit{}) }},
		{"Release nil db", pgcoord.ErrInvalidArgument, func() error { return semaphore.Release(ctx, nil, good) }},
		{"SetLimit 0", pgcoord.ErrInvalidArgument, func() error { return semaphore.SetLimit(ctx, db, "k", 0, nil) }},
		{"SetLimit weight", pgcoord.ErrInvalidArgument, func() error {
			return semaphore.SetLimit(ctx, db, "k", 1, &semaphore.SetLimitOpts{Weight: -1})
		}},
		{"SetLimit weight too big", pgcoord.ErrInvalidArgument, func() error {
			return semaphore.SetLimit(ctx, db, "k", 1, &semaphore.SetLimitOpts{Weight: semaphore.MaxWeight + 1})
		}},
		{"SetLimit bad key", pgcoord.ErrInvalidName, func() error { return semaphore.SetLimit(ctx, db, "", 1, nil) }},
		{"AddDemand limit", pgcoord.ErrInvalidArgument, func() error {
			return semaphore.AddDemand(ctx, db, "k", 1, &semaphore.AddDemandOpts{Limit: -3})
		}},
		{"AddDemand bad key", pgcoord.ErrInvalidName, func() error { return semaphore.AddDemand(ctx, db, long, 1, nil) }},
		{"Next bad key", pgcoord.ErrInvalidName, func() error {
			_, err := semaphore.Next(ctx, db, time.Second, &semaphore.NextOpts{Keys: []string{"ok", ""}})
			return err
		}},
		{"Next nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Next(ctx, nil, time.Second, nil); return err }},
		{"Drain bad key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.Drain(ctx, db, ""); return err }},
		{"Get nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.Get(ctx, nilPool, "k"); return err }},
		{"List limit", pgcoord.ErrInvalidArgument, func() error {
			_, err := semaphore.List(ctx, db, &semaphore.ListOpts{Limit: semaphore.MaxListLimit + 1})
			return err
		}},
		{"List nil db", pgcoord.ErrInvalidArgument, func() error { _, err := semaphore.List(ctx, nil, nil); return err }},
		{"Permits bad key", pgcoord.ErrInvalidName, func() error { _, err := semaphore.Permits(ctx, db, ""); return err }},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want an error wrapping %v", c.name, err, c.want)
		}
	}
}
