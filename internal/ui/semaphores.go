package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/semaphore"
)

type semRow struct {
	semaphore.KeyStatus
	// Status is over_limit, leaked or ok, as `pgcoord semaphores verify` says.
	Status string
	// Scale is the bar's full width in permits: the limit, or more when over it.
	Scale float64
	// OldestWait is how long the first waiter in line has waited.
	OldestWait time.Duration
	// AdmittedShare and WeightShare are the key's share of admissions and of weight among
	// the keys of the page, in percent: a key far below its weight share is served less
	// than its weight entitles it to.
	AdmittedShare, WeightShare float64
	// Starved marks a key that wants permits (waiters or demand) and holds none.
	Starved bool
}

type semaphoresData struct {
	Rows        []semRow
	After, Next string
	// Prefix filters the list (?prefix=); Detail is the key asked for with ?key=.
	Prefix string
	Detail *semDetail
}

func semStatus(s semaphore.KeyStatus) string {
	switch {
	case s.OverLimit():
		return "over_limit"
	case s.Expired > 0:
		return "leaked"
	}
	return "ok"
}

// loadSemaphores reads one page of keys, filtered by prefix (one query), and with ?key=
// the key's permits and waiters (semaphore_detail.go).
func loadSemaphores(ctx context.Context, s *Server, q url.Values) (any, error) {
	var d semaphoresData
	var err error
	if d.After, d.Prefix, err = pageParams(q); err != nil {
		return nil, err
	}
	keys, err := semaphore.List(ctx, s.cfg.Pool, &semaphore.ListOpts{After: d.After, Prefix: d.Prefix, Limit: pageSize + 1})
	if err != nil {
		return nil, err
	}
	keys, d.Next = pageOf(keys, pageSize, func(k semaphore.KeyStatus) string { return k.Key })
	d.Detail, err = detail(q, "key", func(v string) (*semDetail, error) { return loadSemDetail(ctx, s, v) })
	if err != nil {
		return nil, err
	}
	var admitted, weight float64
	for _, k := range keys {
		admitted += float64(k.Admitted)
		weight += float64(k.Weight)
	}
	for _, k := range keys {
		r := semRow{KeyStatus: k, Status: semStatus(k), Scale: float64(max(k.Limit, k.Held+k.Expired)),
			AdmittedShare: pct(float64(k.Admitted), admitted), WeightShare: pct(float64(k.Weight), weight),
			Starved: (k.Waiters > 0 || k.Demand > 0) && k.Held == 0}
		if !k.OldestWaiterSince.IsZero() {
			r.OldestWait = max(k.DBNow.Sub(k.OldestWaiterSince), 0)
		}
		d.Rows = append(d.Rows, r)
	}
	return d, nil
}

// summarizeSemaphores counts keys, permits and problems from one bounded query.
func summarizeSemaphores(ctx context.Context, s *Server) ([]count, error) {
	keys, err := semaphore.List(ctx, s.cfg.Pool, &semaphore.ListOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	more := len(keys) == summaryRows
	var held, waiters, over, leaked int
	for _, k := range keys {
		held += k.Held
		waiters += k.Waiters
		switch semStatus(k) {
		case "over_limit":
			over++
		case "leaked":
			leaked++
		}
	}
	return []count{{"keys", len(keys), more}, {"permits held", held, more}, {"waiters", waiters, more},
		{"keys over their limit", over, more}, {"keys with leaked permits", leaked, more}}, nil
}

// setSemaphoreLimit sets a key's limit (semaphore.SetLimit), in the action's transaction.
func setSemaphoreLimit(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, _ string) (string, map[string]any, string, error) {
	key := form.Get("key")
	if key == "" {
		return "", nil, "", userErrorf(http.StatusBadRequest, "no semaphore key given")
	}
	limit, err := strconv.Atoi(form.Get("limit"))
	if err != nil || limit < 1 {
		return "", nil, "", userErrorf(http.StatusBadRequest, "limit %q: want an integer of at least 1", form.Get("limit"))
	}
	before, err := semaphore.Get(ctx, tx, key)
	if errors.Is(err, semaphore.ErrNotFound) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no such semaphore %q", key)
	}
	if err != nil {
		return "", nil, "", err
	}
	if err := semaphore.SetLimit(ctx, tx, key, limit, nil); err != nil {
		return "", nil, "", err
	}
	msg := fmt.Sprintf("semaphore %q: limit %d (was %d); %d permits held", key, limit, before.Limit, before.Held)
	if before.Held > limit {
		msg += "; nothing was revoked: new admissions wait until fewer than the new limit are held"
	}
	return key, map[string]any{"limit": limit, "previous_limit": before.Limit, "held": before.Held}, msg, nil
}
