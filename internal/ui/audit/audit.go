// Package audit records the operator actions taken from the dashboard (`pgcoord ui
// --allow-actions`) in pgcoord's audit table, and lists them (`pgcoord audit list`).
//
// # Guarantees
//
//   - Record takes the action's own transaction: the row commits with the action or not at
//     all, so every committed action has exactly one row and a rolled-back one has none.
//   - At is the database clock of the recording transaction (now()), never a client's.
//   - Entries are listed newest first by a strictly increasing id, one bounded page at a
//     time.
//   - The log is append-only for every role but the table's owner: a trigger refuses UPDATE,
//     DELETE and TRUNCATE (SQLSTATE 42501) from any other role, whatever was granted to it.
//   - SessionRole is the role the session logged in as (session_user), and At the database
//     clock: for a role other than the owner the database sets both, whatever the INSERT
//     says. Actor is only what the caller claims.
//
// # Failure modes
//
//   - An action on a system outside the database (none exists yet) cannot share the
//     transaction: record it after the action succeeds, and a crash in between loses the row.
//   - The table grows without bound: it is an operator log, a few rows per action taken by
//     hand, and pgcoord_gc never collects it. Only the owner can prune it, with plain SQL
//     (DELETE FROM pgcoord_audit WHERE at < ...).
//   - The owner (and a superuser) can still rewrite or delete any row, and write any
//     session role; a role with the TRIGGER privilege on the table could add a trigger that
//     rewrites new rows. `pgcoord doctor` reports such grants.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// check makes this package's argument errors (their text is the cause alone).
var check = base.Check("")

// Bounds of an entry's text fields (the CHECKs of pgcoord_audit).
const (
	MaxActorLen  = 255
	MaxActionLen = 100
	MaxTargetLen = 1000
)

// ErrInvalid is returned, before any SQL runs, for an entry with an empty or oversized
// actor or action, or an oversized target.
var ErrInvalid = errors.New("audit: invalid entry")

// Entry is one recorded action.
type Entry struct {
	// ID orders entries: a later entry has a higher ID. Set by Record.
	ID int64
	// At is when the action's transaction ran, by the database clock. Set by Record.
	At time.Time
	// Actor is who acted: a name (given at the dashboard's login, or the CLI's --actor,
	// by default the OS user and host) with what identifies its credentials.
	Actor string
	// SessionRole is the database role the recording session logged in as (session_user),
	// set by the database whatever the entry says: the actor is claimed, the session role
	// is not. Empty for entries recorded before the column existed. Set by Record.
	SessionRole string
	// RemoteAddr is the client address of the request.
	RemoteAddr string
	// Action names what was done, as "primitive.verb" (lease.expire, semaphore.set_limit).
	Action string
	// Target is what it was done to: a lease name, a semaphore key, ...
	Target string
	// Details are the action's parameters and outcome; never nil after Record or List.
	Details map[string]any
}

// MaxNameLen bounds an operator's own name (CheckActor), so that with what identifies its
// credentials the actor still fits MaxActorLen.
const MaxNameLen = 64

// CheckActor checks the name an operator gives for the audit log (`--actor`, the
// dashboard's login form): 1 to MaxNameLen bytes of UTF-8 without control characters.
func CheckActor(name string) error {
	switch {
	case name == "" || len(name) > MaxNameLen:
		return fmt.Errorf("%w: a name must be 1 to %d bytes", ErrInvalid, MaxNameLen)
	case !utf8.ValidString(name) || strings.ContainsFunc(name, base.IsControl):
		return fmt.Errorf("%w: a name must be UTF-8 without control characters", ErrInvalid)
	}
	return nil
}

func (e Entry) validate() error {
	switch {
	case e.Actor == "" || len(e.Actor) > MaxActorLen:
		return fmt.Errorf("%w: actor must be 1 to %d bytes", ErrInvalid, MaxActorLen)
	case e.Action == "" || len(e.Action) > MaxActionLen:
		return fmt.Errorf("%w: action must be 1 to %d bytes", ErrInvalid, MaxActionLen)
	case len(e.Target) > MaxTargetLen:
		return fmt.Errorf("%w: target longer than %d bytes", ErrInvalid, MaxTargetLen)
	case !utf8.ValidString(e.Actor + e.RemoteAddr + e.Action + e.Target):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalid)
	}
	return nil
}

// Record writes e in db — pass the transaction that performs the action — and returns it
// with its ID and time. It returns ErrInvalid for a bad entry before any SQL runs.
func Record(ctx context.Context, db pgcoord.DBTX, e Entry) (Entry, error) {
	if err := e.validate(); err != nil {
		return Entry{}, err
	}
	if err := check.DB(db); err != nil {
		return Entry{}, err
	}
	details := e.Details
	if details == nil {
		details = map[string]any{}
	}
	js, err := json.Marshal(details)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: details: %v", ErrInvalid, err)
	}
	row, err := queries.InsertAudit(ctx, db, dbsqlc.InsertAuditParams{
		Actor: e.Actor, RemoteAddr: e.RemoteAddr, Action: e.Action, Target: e.Target, Details: js,
	})
	if err != nil {
		return Entry{}, fmt.Errorf("audit: record %s %q: %w", e.Action, e.Target, err)
	}
	return entryOf(row)
}

// ListOpts are the options of List. A nil *ListOpts lists the newest
// pgcoord.DefaultListLimit entries.
type ListOpts struct {
	// Before lists entries whose ID is below it: pass the last ID of one page to get the
	// next. Zero starts from the newest.
	Before int64
	// Action, if set, lists only entries of that action.
	Action string
	// TargetPrefix, if set, lists only entries whose target starts with it, character for
	// character ('%' and '_' are plain characters). At most 255 bytes.
	TargetPrefix string
	// Limit caps the number of entries. Default pgcoord.DefaultListLimit; at most
	// pgcoord.MaxListLimit.
	Limit int
}

// List returns entries newest first, one page at a time, never nil.
func List(ctx context.Context, db pgcoord.DBTX, opts *ListOpts) ([]Entry, error) {
	if err := check.DB(db); err != nil {
		return nil, err
	}
	var o ListOpts
	if opts != nil {
		o = *opts
	}
	limit, err := check.ListLimit(o.Limit)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if o.Before < 0 {
		return nil, check.Invalid("audit: Before %d is negative", o.Before)
	}
	var action *string
	if o.Action != "" {
		action = &o.Action
	}
	if o.TargetPrefix != "" {
		if err := check.Name("prefix of an audit target", o.TargetPrefix); err != nil {
			return nil, err
		}
	}
	rows, err := queries.ListAudit(ctx, db, dbsqlc.ListAuditParams{BeforeID: o.Before, Action: action, TargetPrefix: o.TargetPrefix, MaxRows: limit})
	if err != nil {
		return nil, fmt.Errorf("audit: list: %w", err)
	}
	out := make([]Entry, 0, len(rows))
	for _, r := range rows {
		e, err := entryOf(r)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func entryOf(r dbsqlc.PgcoordAudit) (Entry, error) {
	e := Entry{ID: r.ID, At: r.At, Actor: r.Actor, SessionRole: r.SessionRole, RemoteAddr: r.RemoteAddr, Action: r.Action, Target: r.Target}
	if err := json.Unmarshal(r.Details, &e.Details); err != nil {
		return Entry{}, fmt.Errorf("audit: entry %d: details: %w", r.ID, err)
	}
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	return e, nil
}

var queries dbsqlc.Queries
