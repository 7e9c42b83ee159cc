package schedules_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cronspec"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/pgcoord"
	"github.com/pgcoord/pgcoord/schedules"
)

// badSchedules are definitions every call refuses, with a word its error must name.
var badSchedules = []struct {
	name string
	edit func(*schedules.Schedule)
	want string
}{
	{"empty name", func(s *schedules.Schedule) { s.Name = "" }, "schedule"},
	{"long name", func(s *schedules.Schedule) { s.Name = strings.Repeat("n", 256) }, "schedule"},
	{"empty handler", func(s *schedules.Schedule) { s.Handler = "" }, "handler"},
	{"minute 61", func(s *schedules.Schedule) { s.Expr = "0 61 * * * *" }, "column 3 (minute)"},
	{"four fields", func(s *schedules.Schedule) { s.Expr = "* * * *" }, "bad expression"},
	{"end before start", func(s *schedules.Schedule) {
		s.StartsAt = time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
		s.EndsAt = s.StartsAt.Add(-time.Hour)
	}, "end"},
	{"catch-up 0.5s", func(s *schedules.Schedule) { s.CatchUp = 500 * time.Millisecond }, "catch-up"},
	{"negative jitter", func(s *schedules.Schedule) { s.Jitter = -time.Second }, "jitter"},
	{"deadline over 24h", func(s *schedules.Schedule) { s.Deadline = 25 * time.Hour }, "deadline"},
	{"args not JSON", func(s *schedules.Schedule) { s.Args = json.RawMessage(`{"a":`) }, "JSON"},
	{"args over 64 KiB", func(s *schedules.Schedule) { s.Args = bigArgs() }, "args"},
	{"bad overlap", func(s *schedules.Schedule) { s.Overlap = "sometimes" }, "overlap"},
	{"bad policy", func(s *schedules.Schedule) { s.CatchUpPolicy = "most" }, "catch-up policy"},
}

// bigArgs is a JSON string of MaxArgs+1 bytes.
func bigArgs() json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("x", schedules.MaxArgs-1) + `"`)
}

func goodSchedule() schedules.Schedule {
	return schedules.Schedule{Name: "good", Expr: "*/5 * * * *", Zone: "Europe/Berlin", Handler: "h"}
}

// TestBadInputWritesNothing: Create and Update refuse each bad definition, Pause a bad name
// or note, naming the problem and wrapping the package's invalid-input errors; nothing is
// written.
func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	for _, c := range badSchedules {
		s := goodSchedule()
		c.edit(&s)
		_, cerr := schedules.Create(ctx, pool, s, nil)
		_, uerr := schedules.Update(ctx, pool, s, nil)
		for call, err := range map[string]error{"Create": cerr, "Update": uerr} {
			if !errors.Is(err, pgcoord.ErrInvalidArgument) && !errors.Is(err, pgcoord.ErrInvalidName) {
				t.Errorf("%s %s: %v, want an invalid-input error", call, c.name, err)
			} else if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %s: %q does not name %q", call, c.name, err, c.want)
			}
		}
	}
	s := goodSchedule()
	s.Expr = "0 61 * * *"
	_, err := schedules.Create(ctx, pool, s, nil)
	var pe *cronspec.ParseError
	if !errors.As(err, &pe) || pe.Column != 3 || pe.Field != "hour" {
		t.Errorf("Create with hour 61: %v, want a ParseError at column 3 (hour)", err)
	}
	s = goodSchedule()
	s.Zone = "Mars/Olympus_Mons"
	if _, err := schedules.Create(ctx, pool, s, nil); !errors.Is(err, schedules.ErrUnknownZone) {
		t.Errorf("Create in an unknown zone: %v, want ErrUnknownZone", err)
	}
	if _, err := schedules.Pause(ctx, pool, "", "", nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Pause of an empty name: %v, want ErrInvalidName", err)
	}
	if _, err := schedules.Pause(ctx, pool, "good", strings.Repeat("n", schedules.MaxNoteLen+1), nil); !errors.Is(err, pgcoord.ErrInvalidArgument) {
		t.Errorf("Pause with a long note: %v, want ErrInvalidArgument", err)
	}
	if _, err := schedules.Backfill(ctx, pool, "", time.Now().Add(-time.Hour), time.Now(), nil); !errors.Is(err, pgcoord.ErrInvalidName) {
		t.Errorf("Backfill of an empty name: %v, want ErrInvalidName", err)
	}
	expectEmpty(t, pool)
}

// TestBadBackfillWritesNothing: a backfill range with more than MaxBackfill ticks, with
// none, or reversed is refused, and records no run.
func TestBadBackfillWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	if _, err := schedules.Create(ctx, pool, schedules.Schedule{Name: "sec", Expr: "* * * * * *", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	audits := count(t, pool, "pgcoord_audit")
	to := time.Now().Add(-time.Minute).Truncate(time.Second)
	for _, c := range []struct {
		name     string
		from, to time.Time
		want     string
	}{
		{"10001 ticks", to.Add(-schedules.MaxBackfill * time.Second), to, "more than 10000 ticks"},
		{"no tick", to.Add(100 * time.Millisecond), to.Add(900 * time.Millisecond), "no tick"},
		{"reversed", to, to.Add(-time.Hour), "empty"},
	} {
		n, err := schedules.Backfill(ctx, pool, "sec", c.from, c.to, nil)
		if !errors.Is(err, pgcoord.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) || n != 0 {
			t.Errorf("Backfill %s: %d, %v; want 0 and an invalid-argument error naming %q", c.name, n, err, c.want)
		}
	}
	if n := count(t, pool, "pgcoord_job_runs"); n != 0 {
		t.Errorf("%d runs recorded, want none", n)
	}
	if n := count(t, pool, "pgcoord_audit"); n != audits {
		t.Errorf("%d audit rows, want %d", n, audits)
	}
}

// TestBadSQLInputWritesNothing: pgcoord_schedule_create refuses the same bad values with
// SQLSTATE 22023 (22004 for NULL) and a message naming the problem; nothing is written.
func TestBadSQLInputWritesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ptr := func(s string) *string { return &s }
	good := func() map[string]*string {
		return map[string]*string{"p_name": ptr("good"), "p_expr": ptr("*/5 * * * *"), "p_zone": ptr("Europe/Berlin"),
			"p_handler": ptr("h"), "p_args": ptr("{}"), "p_catch_up": ptr("1 hour"), "p_catch_up_policy": ptr("latest"),
			"p_overlap": ptr("forbid"), "p_jitter": ptr("0"), "p_deadline": nil, "p_starts_at": nil, "p_ends_at": nil}
	}
	big := `"` + strings.Repeat("x", schedules.MaxArgs-1) + `"`
	for _, c := range []struct {
		name, arg string
		value     *string
		code      string
		want      string
	}{
		{"empty name", "p_name", ptr(""), "22023", "schedule name"},
		{"null name", "p_name", nil, "22004", "schedule name"},
		{"minute 61", "p_expr", ptr("0 61 * * * *"), "22023", "minute"},
		{"null expression", "p_expr", nil, "22004", "expression"},
		{"unknown zone", "p_zone", ptr("Mars/Olympus_Mons"), "22023", "zone"},
		{"empty handler", "p_handler", ptr(""), "22023", "handler"},
		{"args over 64 KiB", "p_args", &big, "22023", "args"},
		{"catch-up 0.5s", "p_catch_up", ptr("0.5 seconds"), "22023", "catch-up window"},
		{"bad policy", "p_catch_up_policy", ptr("most"), "22023", "catch-up policy"},
		{"bad overlap", "p_overlap", ptr("sometimes"), "22023", "overlap"},
		{"negative jitter", "p_jitter", ptr("-1 second"), "22023", "jitter"},
		{"deadline over 24h", "p_deadline", ptr("25 hours"), "22023", "deadline"},
		{"end before start", "p_ends_at", ptr("2026-01-01T00:00:00Z"), "22023", "end"},
	} {
		args := good()
		args["p_starts_at"] = ptr("2026-01-02T00:00:00Z")
		args[c.arg] = c.value
		_, err := pool.Exec(t.Context(), `SELECT pgcoord_schedule_create(p_name => $1, p_expr => $2, p_zone => $3,
			p_handler => $4, p_args => $5::jsonb, p_catch_up => $6::interval, p_catch_up_policy => $7, p_overlap => $8,
			p_jitter => $9::interval, p_deadline => $10::interval, p_starts_at => $11::timestamptz, p_ends_at => $12::timestamptz)`,
			args["p_name"], args["p_expr"], args["p_zone"], args["p_handler"], args["p_args"], args["p_catch_up"],
			args["p_catch_up_policy"], args["p_overlap"], args["p_jitter"], args["p_deadline"], args["p_starts_at"], args["p_ends_at"])
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != c.code || !strings.Contains(pgErr.Message, c.want) {
			t.Errorf("%s: %v, want SQLSTATE %s naming %q", c.name, err, c.code, c.want)
		}
	}
	expectEmpty(t, pool)
}

// expectEmpty fails t unless no schedule, job or audit row was written.
func expectEmpty(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, table := range []string{"pgcoord_schedules", "pgcoord_jobs", "pgcoord_job_runs", "pgcoord_audit"} {
		if n := count(t, pool, table); n != 0 {
			t.Errorf("%s has %d rows after refused input, want none", table, n)
		}
	}
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
