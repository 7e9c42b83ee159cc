package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/ratelimit"
)

type ratelimitsData struct {
	Policies []ratelimit.Policy
	More     bool
	// Policy and Key are the key asked for with ?policy=&key=; State its state, or
	// StateErr why there is none.
	Policy, Key string
	State       *ratelimit.KeyState
	StateErr    string
}

// loadRatelimits reads the policies (one bounded query) and, with ?policy=&key=, one key's
// state (one more).
func loadRatelimits(ctx context.Context, s *Server, q url.Values) (any, error) {
	d := ratelimitsData{Policy: q.Get("policy"), Key: q.Get("key")}
	ps, err := ratelimit.List(ctx, s.cfg.Pool, &ratelimit.ListOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	d.Policies, d.More = ps, len(ps) == summaryRows
	if d.Policy != "" || d.Key != "" {
		st, err := ratelimit.State(ctx, s.cfg.Pool, ratelimit.Limit{Policy: d.Policy, Key: d.Key})
		if err != nil {
			d.StateErr = err.Error() // an unknown policy, or a bad name said before any SQL
		} else {
			d.State = &st
		}
	}
	return d, nil
}

// summarizeRatelimits counts the policies and those in shadow mode.
func summarizeRatelimits(ctx context.Context, s *Server) ([]count, error) {
	ps, err := ratelimit.List(ctx, s.cfg.Pool, &ratelimit.ListOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	more := len(ps) == summaryRows
	shadow := 0
	for _, p := range ps {
		if p.Shadow {
			shadow++
		}
	}
	return []count{{"policies", len(ps), more}, {"in shadow mode", shadow, more}}, nil
}

// resetRatelimitKey gives a key its full burst back (ratelimit.Reset), in the action's
// transaction.
func resetRatelimitKey(ctx context.Context, tx pgx.Tx, _ *Server, form url.Values, _ string) (string, map[string]any, string, error) {
	l := ratelimit.Limit{Policy: form.Get("policy"), Key: form.Get("key")}
	if _, err := ratelimit.Get(ctx, tx, l.Policy); errors.Is(err, ratelimit.ErrUnknownPolicy) {
		return "", nil, "", userErrorf(http.StatusNotFound, "no rate limit policy %q", l.Policy)
	} else if err != nil {
		return "", nil, "", userErrorf(http.StatusBadRequest, "%v", err)
	}
	had, err := ratelimit.Reset(ctx, tx, l)
	if err != nil {
		return "", nil, "", userErrorf(http.StatusBadRequest, "%v", err)
	}
	return l.Policy + " " + l.Key, map[string]any{"key": l.Key, "had_state": had},
		fmt.Sprintf("reset key %q of rate limit %q: a full burst again", l.Key, l.Policy), nil
}
