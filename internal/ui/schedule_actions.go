package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/schedules"
)

// The schedule actions call package schedules with the operator as the actor: each of
// its calls writes the action's audit row itself (schedule.pause, schedule.resume,
// schedule.trigger), in the action's transaction, so the actions are marked audited.

// pauseSchedule pauses a schedule (schedules.Pause) with the operator's note. A schedule
// paused already is refused (409): pausing it again would change nothing but be audited.
func pauseSchedule(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	name, note := form.Get("name"), form.Get("note")
	if err := check.Name("schedule", name); err != nil {
		return "", nil, "", err
	}
	if note == "" || len(note) > schedules.MaxNoteLen || !utf8.ValidString(note) || strings.ContainsFunc(note, base.IsControl) {
		return "", nil, "", userErrorf(http.StatusBadRequest, "a pause needs a note saying why: 1 to %d bytes of UTF-8 without control characters", schedules.MaxNoteLen)
	}
	paused, by, err := lockSchedule(ctx, tx, name)
	if err != nil {
		return "", nil, "", err
	}
	if paused {
		return "", nil, "", userErrorf(http.StatusConflict, "schedule %q is paused already, by %s", name, by)
	}
	if _, err := schedules.Pause(ctx, tx, name, note, &schedules.ChangeOpts{Actor: actor}); err != nil {
		return "", nil, "", err
	}
	return name, nil, fmt.Sprintf("paused schedule %q: no tick runs until it is resumed", name), nil
}

// resumeSchedule resumes a paused schedule (schedules.Resume). One that is not paused is
// refused (409): resuming it would change nothing, and write no audit row.
func resumeSchedule(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	name := form.Get("name")
	if err := check.Name("schedule", name); err != nil {
		return "", nil, "", err
	}
	paused, _, err := lockSchedule(ctx, tx, name)
	if err != nil {
		return "", nil, "", err
	}
	if !paused {
		return "", nil, "", userErrorf(http.StatusConflict, "schedule %q is not paused", name)
	}
	i, err := schedules.Resume(ctx, tx, name, &schedules.ChangeOpts{Actor: actor})
	if err != nil {
		return "", nil, "", err
	}
	next := "it has no tick left"
	if !i.NextTick.IsZero() {
		next = fmt.Sprintf("its next tick is %s (%s)", zoned(i.NextTick, i.Zone), timestamp(i.NextTick))
	}
	return name, nil, fmt.Sprintf("resumed schedule %q: %s; the ticks that came while it was paused do not run", name, next), nil
}

// triggerSchedule asks for a run of a schedule now (schedules.Trigger).
func triggerSchedule(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	name := form.Get("name")
	if err := check.Name("schedule", name); err != nil {
		return "", nil, "", err
	}
	run, err := schedules.Trigger(ctx, tx, name, &schedules.ChangeOpts{Actor: actor})
	if errors.Is(err, schedules.ErrNotFound) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no schedule %q", name)
	}
	if err != nil {
		return "", nil, "", err
	}
	return name, nil, fmt.Sprintf("triggered schedule %q: its run for %s is pending, and starts as soon as no run of it is running",
		name, timestamp(run.Tick)), nil
}

// lockSchedule locks a schedule's row for the action's transaction, so that whether it is
// paused holds until the action's change commits, and says so (and by whom).
func lockSchedule(ctx context.Context, tx pgx.Tx, name string) (paused bool, by string, err error) {
	err = tx.QueryRow(ctx, `SELECT paused_at IS NOT NULL, coalesce(paused_by, '') FROM pgcoord_schedules
		WHERE name = $1 FOR NO KEY UPDATE`, name).Scan(&paused, &by)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, "", userErrorf(http.StatusNotFound, "no schedule %q", name)
	}
	return paused, by, err
}

// scheduleBack returns a schedule action to the schedule's page.
func scheduleBack(form url.Values) string { return schedulePath(form.Get("name")) }
