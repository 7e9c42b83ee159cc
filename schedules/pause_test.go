package schedules_test

import (
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/schedules"
)

// TestPauseTwiceAuditsOnce: pausing a paused schedule (or resuming an active one) changes
// nothing and writes no audit row; the first pause's note and actor stay.
func TestPauseTwiceAuditsOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := schedules.Create(t.Context(), pool, schedules.Schedule{Name: "p", Expr: "@hourly", Handler: "h"}, nil); err != nil {
		t.Fatal(err)
	}
	first, err := schedules.Pause(t.Context(), pool, "p", "first", &schedules.ChangeOpts{Actor: "a"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := schedules.Pause(t.Context(), pool, "p", "second", &schedules.ChangeOpts{Actor: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Version != first.Version || again.PausedNote != "first" || again.PausedBy != "a" {
		t.Errorf("second pause: version %d note %q by %q; want version %d, the first pause's note and actor",
			again.Version, again.PausedNote, again.PausedBy, first.Version)
	}
	if _, err := schedules.Resume(t.Context(), pool, "p", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := schedules.Resume(t.Context(), pool, "p", nil); err != nil {
		t.Fatal(err)
	}
	var pauses, resumes int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE action = 'schedule.pause'),
		count(*) FILTER (WHERE action = 'schedule.resume') FROM pgcoord_audit WHERE target = 'p'`).Scan(&pauses, &resumes); err != nil {
		t.Fatal(err)
	}
	if pauses != 1 || resumes != 1 {
		t.Errorf("%d pause and %d resume audit rows, want 1 and 1", pauses, resumes)
	}
}
