package ui

import (
	"context"
	"errors"
	"net/url"
	"time"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/pgcoord"
)

type keyRow struct {
	idempotency.KeyInfo
	// Age is how long ago the key's first attempt began; Idle how long ago it last
	// changed (its latest recovery point), by the database clock.
	Age, Idle time.Duration
}

// keyCounts are the counts of the page's header and of the Overview's card.
type keyCounts struct {
	InFlight, Stuck, Completed int
	// More reports that there were more keys than one bounded read (summaryRows): the
	// counts are lower bounds.
	InFlightMore, CompletedMore bool
}

type idempotencyData struct {
	Counts keyCounts
	Rows   []keyRow
	// AfterScope/AfterKey start this page; NextScope/NextKey the next one.
	AfterScope, AfterKey, NextScope, NextKey string
	// Lookup is the key asked for with ?scope=&key= (nil if none), LookupErr why it is
	// missing.
	Lookup    *idempotency.KeyInfo
	LookupErr string
	Scope     string
	Key       string
	// Find is the search by scope, key prefix and state (idempotency_find.go).
	Find keyFind
}

// loadIdempotency reads one page of keys in flight, the counts (two bounded lists) and,
// when asked, one key and one page of a search: at most five queries.
func loadIdempotency(ctx context.Context, s *Server, q url.Values) (any, error) {
	d := idempotencyData{AfterScope: q.Get("after_scope"), AfterKey: q.Get("after_key"), Scope: q.Get("scope"), Key: q.Get("key")}
	var err error
	if d.Find, err = findParams(q); err != nil {
		return nil, err
	}
	if d.Find.Active() {
		if d.Find, err = findKeys(ctx, s, d.Find); err != nil {
			return nil, err
		}
	}
	keys, err := idempotency.List(ctx, s.cfg.Pool, &idempotency.ListOpts{
		InFlight: true, AfterScope: d.AfterScope, AfterKey: d.AfterKey, Limit: pageSize + 1})
	if err != nil {
		return nil, err
	}
	if len(keys) > pageSize {
		keys = keys[:pageSize]
		d.NextScope, d.NextKey = keys[pageSize-1].Scope, keys[pageSize-1].Key
	}
	for _, k := range keys {
		d.Rows = append(d.Rows, keyRow{KeyInfo: k, Age: max(k.DBNow.Sub(k.CreatedAt), 0), Idle: max(k.DBNow.Sub(k.UpdatedAt), 0)})
	}
	if d.Counts, err = countKeys(ctx, s); err != nil {
		return nil, err
	}
	if d.Scope != "" || d.Key != "" {
		k, err := idempotency.Get(ctx, s.cfg.Pool, d.Scope, d.Key)
		switch {
		case errors.Is(err, idempotency.ErrNotFound):
			// A link's text is not shown back, not even in the form: only a key that exists is.
			d.Scope, d.Key, d.LookupErr = "", "", "no key of that name in that scope"
		case errors.Is(err, pgcoord.ErrInvalidName) || errors.Is(err, pgcoord.ErrInvalidArgument):
			d.Scope, d.Key, d.LookupErr = "", "", "not a valid scope and key" // said before any SQL
		case err != nil:
			return nil, err
		default:
			d.Lookup = &k
		}
	}
	return d, nil
}

// countKeys counts the keys in flight, stuck and completed from two lists of at most
// summaryRows keys each: the keys in flight, and all keys.
func countKeys(ctx context.Context, s *Server) (keyCounts, error) {
	var c keyCounts
	inFlight, err := idempotency.List(ctx, s.cfg.Pool, &idempotency.ListOpts{InFlight: true, Limit: summaryRows})
	if err != nil {
		return c, err
	}
	c.InFlight, c.InFlightMore = len(inFlight), len(inFlight) == summaryRows
	for _, k := range inFlight {
		if k.Stuck() {
			c.Stuck++
		}
	}
	all, err := idempotency.List(ctx, s.cfg.Pool, &idempotency.ListOpts{Limit: summaryRows})
	if err != nil {
		return c, err
	}
	c.CompletedMore = len(all) == summaryRows
	for _, k := range all {
		if k.State == idempotency.StateCompleted {
			c.Completed++
		}
	}
	return c, nil
}

// summarizeIdempotency counts keys in flight, stuck and completed: two bounded queries.
func summarizeIdempotency(ctx context.Context, s *Server) ([]count, error) {
	c, err := countKeys(ctx, s)
	if err != nil {
		return nil, err
	}
	return []count{{"keys in flight", c.InFlight, c.InFlightMore}, {"stuck (holder died)", c.Stuck, c.InFlightMore},
		{"completed", c.Completed, c.CompletedMore}}, nil
}
