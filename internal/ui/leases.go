package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/leases"
)

// Lease states as the page shows them.
const (
	leaseHeld    = "held"
	leaseExpired = "expired" // expired by time, never released, not taken since
	leaseFree    = "free"
)

type leaseRow struct {
	leases.Info
	State string
	// TTL is the length of the current grant (from its last renewal); LeftPct the share
	// of it left, by the database clock.
	TTL     time.Duration
	LeftPct float64
	// Late marks a held lease with less than a quarter of its TTL left: its holder renews
	// late (a near miss in the making) or has stopped.
	Late bool
}

type leasesData struct {
	Rows        []leaseRow
	After, Next string // this page starts after After; Next is the next page's After ("" if none)
	// Prefix filters the list (?prefix=); Detail is the lease asked for with ?name=.
	Prefix string
	Detail *leaseDetail
}

func leaseRowOf(i leases.Info) leaseRow {
	r := leaseRow{Info: i, State: leaseFree}
	switch {
	case i.Held():
		r.State = leaseHeld
		start := i.AcquiredAt
		if i.RenewedAt.After(start) {
			start = i.RenewedAt
		}
		r.TTL = i.ExpiresAt.Sub(start)
		r.LeftPct = pct(float64(i.Remaining()), float64(r.TTL))
		r.Late = i.Remaining() < r.TTL/4
	case i.Holder != "":
		r.State = leaseExpired
	}
	return r
}

// loadLeases reads one page of leases, filtered by name prefix (one query), and with
// ?name= the lease's detail (lease_detail.go).
func loadLeases(ctx context.Context, s *Server, q url.Values) (any, error) {
	var d leasesData
	var err error
	if d.After, d.Prefix, err = pageParams(q); err != nil {
		return nil, err
	}
	all, err := leases.List(ctx, s.cfg.Pool, &leases.ListOpts{After: d.After, Prefix: d.Prefix, Limit: pageSize + 1})
	if err != nil {
		return nil, err
	}
	all, d.Next = pageOf(all, pageSize, func(i leases.Info) string { return i.Name })
	for _, i := range all {
		d.Rows = append(d.Rows, leaseRowOf(i))
	}
	d.Detail, err = detail(q, "name", func(v string) (*leaseDetail, error) { return loadLeaseDetail(ctx, s, v) })
	if err != nil {
		return nil, err
	}
	return d, nil
}

// summarizeLeases counts leases by state from one bounded query.
func summarizeLeases(ctx context.Context, s *Server) ([]count, error) {
	all, err := leases.List(ctx, s.cfg.Pool, &leases.ListOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	more := len(all) == summaryRows
	var held, expired, forced, late, nearMissed int
	for _, i := range all {
		r := leaseRowOf(i)
		if i.NearMisses > 0 {
			nearMissed++
		}
		switch {
		case r.State == leaseHeld:
			held++
			if r.Late {
				late++
			}
		case r.State == leaseExpired:
			expired++
		case i.ExpiredBy != "":
			forced++
		}
	}
	return []count{{"leases", len(all), more}, {"held", held, more}, {"renewing late", late, more},
		{"expired, not released", expired, more}, {"expired by an operator", forced, more},
		{"with near misses", nearMissed, more}}, nil
}

// expireLease is the operator's forced expiry (leases.Expire), in the action's transaction.
func expireLease(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, actor string) (string, map[string]any, string, error) {
	name := form.Get("name")
	if name == "" {
		return "", nil, "", userErrorf(http.StatusBadRequest, "no lease name given")
	}
	i, err := leases.Expire(ctx, tx, name, actor+" via pgcoord-ui")
	if errors.Is(err, leases.ErrNotFound) { // never granted, or no holder any more
		return "", nil, "", userErrorf(http.StatusConflict, "%v", err)
	}
	if err != nil {
		return "", nil, "", err
	}
	details := map[string]any{"holder": i.Holder, "fence_token": i.Token, "was_held": i.Held()}
	if !i.ExpiresAt.IsZero() {
		details["expires_at"] = i.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	msg := fmt.Sprintf("expired lease %q: it was held by %s with fence token %d; the next grant gets a higher token",
		name, i.Holder, i.Token)
	return name, details, msg, nil
}
