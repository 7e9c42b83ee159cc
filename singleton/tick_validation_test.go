package singleton_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/singleton"
)

// Bad jobs and arguments are refused before any SQL runs: a nil handle proves it.
func TestTickValidation(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	good := singleton.Job{Name: "ok", Every: time.Minute}
	cases := []struct {
		job  singleton.Job
		opts *singleton.ClaimOpts
		want error
	}{
		{singleton.Job{Every: time.Minute}, nil, pgcoord.ErrInvalidName},
		{singleton.Job{Name: strings.Repeat("j", pgcoord.MaxNameLen+1), Every: time.Minute}, nil, pgcoord.ErrInvalidName},
		{singleton.Job{Name: "j"}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: -time.Second}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: singleton.MaxEvery + time.Hour}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: 1500 * time.Nanosecond}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, TTL: -time.Second}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, TTL: 25 * time.Hour}, nil, pgcoord.ErrInvalidArgument},
		{singleton.Job{Name: "j", Every: time.Minute, Overlap: "sometimes"}, nil, pgcoord.ErrInvalidArgument},
		{good, &singleton.ClaimOpts{Holder: "nul\x00"}, pgcoord.ErrInvalidName},
		{good, nil, pgcoord.ErrInvalidArgument}, // valid: the nil handle is refused
	}
	for _, c := range cases {
		if _, err := singleton.ClaimTick(ctx, nil, c.job, c.opts); !errors.Is(err, c.want) {
			t.Errorf("ClaimTick(%+v, %+v) = %v, want %v", c.job, c.opts, err, c.want)
		}
	}
	// A grant must be durable: lower synchronous_commit levels are refused, before the
	// handle is looked at.
	bad := singleton.Job{Name: "j", Every: time.Minute, SyncCommit: "off"}
	if _, err := singleton.ClaimTick(ctx, nil, bad, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Errorf("ClaimTick with SyncCommit off: %v, want an invalid-argument error naming synchronous_commit", err)
	}
	run := singleton.Run{Job: "ok", ScheduledFor: t0, Token: 1}
	for _, ttl := range []time.Duration{0, -time.Second, singleton.MaxTTL + time.Second} {
		if _, err := singleton.HeartbeatTick(ctx, nil, run, ttl); !errors.Is(err, pgcoord.ErrInvalidArgument) {
			t.Errorf("HeartbeatTick with TTL %v: %v", ttl, err)
		}
	}
	if _, err := singleton.HeartbeatTick(ctx, nil, run, time.Second); !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil") {
		t.Errorf("HeartbeatTick(nil db) of a good run: %v", err)
	}
	// Runs no claim returned: the SQL functions would refuse them (22004, 22023); the Go
	// API says what is wrong before sending anything.
	badRuns := []struct {
		run  singleton.Run
		want error
	}{
		{singleton.Run{}, pgcoord.ErrInvalidName},
		{singleton.Run{Job: strings.Repeat("j", pgcoord.MaxNameLen+1), ScheduledFor: t0, Token: 1}, pgcoord.ErrInvalidName},
		{singleton.Run{Job: "ok", Token: 1}, pgcoord.ErrInvalidArgument},                    // no tick
		{singleton.Run{Job: "ok", ScheduledFor: t0}, pgcoord.ErrInvalidArgument},            // no token
		{singleton.Run{Job: "ok", ScheduledFor: t0, Token: -5}, pgcoord.ErrInvalidArgument}, // negative token
	}
	for _, c := range badRuns {
		if _, err := singleton.HeartbeatTick(ctx, nil, c.run, time.Second); !errors.Is(err, c.want) || strings.Contains(err.Error(), "nil") {
			t.Errorf("HeartbeatTick(%+v) = %v, want %v about the run", c.run, err, c.want)
		}
		if err := singleton.FinishTick(ctx, nil, c.run, nil); !errors.Is(err, c.want) || strings.Contains(err.Error(), "nil") {
			t.Errorf("FinishTick(%+v) = %v, want %v about the run", c.run, err, c.want)
		}
	}
	if _, err := singleton.ListJobs(ctx, nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("ListJobs(nil): %v", err)
	}
	if _, err := singleton.ListRuns(ctx, nil, "", nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("ListRuns(\"\"): %v", err)
	}
	fn := func(context.Context, singleton.Run) error { return nil }
	if _, err := singleton.RunTick(ctx, nil, good, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(nil pool): %v", err)
	}
	if _, err := singleton.RunTick(ctx, nil, singleton.Job{Name: "j"}, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(no Every): %v", err)
	}
	if err := singleton.Schedule(ctx, nil, good, fn, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Schedule(nil pool): %v", err)
	}
	pool := pgtest.Pool(t)
	if _, err := singleton.RunTick(ctx, pool, good, nil, nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("RunTick(nil fn): %v", err)
	}
	if err := singleton.Schedule(ctx, pool, good, fn, &singleton.ScheduleOpts{Delay: time.Minute}); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Schedule with Delay = Every: %v", err)
	}
	if err := singleton.Schedule(ctx, pool, good, fn, &singleton.ScheduleOpts{Holder: "\xff"}); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Schedule with a bad holder: %v", err)
	}
}
