package ui

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/idempotency"
)

// keyFind is the Idempotency page's search: keys by scope, key prefix and state.
type keyFind struct {
	// In is the scope (exact; "" for every scope), Prefix the start of the key, State
	// in_flight, completed or "" for both.
	In, Prefix, State string
	Rows              []keyRow
	// AfterScope/AfterKey start this page; NextScope/NextKey the next one ("" if none).
	AfterScope, AfterKey, NextScope, NextKey string
}

// Active reports whether the search was asked for.
func (f keyFind) Active() bool { return f.In != "" || f.Prefix != "" || f.State != "" }

// findParams reads the search's parameters: ?in= (scope), ?prefix=, ?state= and its page
// (?find_after_scope=, ?find_after_key=).
func findParams(q url.Values) (keyFind, error) {
	var f keyFind
	err := params(q, map[string]*string{"in": &f.In, "prefix": &f.Prefix, "state": &f.State,
		"find_after_scope": &f.AfterScope, "find_after_key": &f.AfterKey})
	if err != nil {
		return f, err
	}
	switch f.State {
	case "", idempotency.StateInFlight, idempotency.StateCompleted:
	default:
		return f, userErrorf(http.StatusBadRequest, "state: want %s, %s or nothing", idempotency.StateInFlight, idempotency.StateCompleted)
	}
	return f, nil
}

// findKeys reads one page of the keys that match f, in (scope, key) order: one statement,
// a walk of the primary key (a range of it when the scope is given) that stops after
// pageSize+1 matches.
func findKeys(ctx context.Context, s *Server, f keyFind) (keyFind, error) {
	rows, err := s.cfg.Pool.Query(ctx, `
		SELECT k.scope, k.key, k.state, k.holder, k.attempts, coalesce(k.recovery_point, ''), coalesce(k.status, 0),
		       coalesce(octet_length(k.body), 0), k.created_at, k.updated_at, coalesce(k.completed_at, 'epoch'),
		       k.expires_at, (k.state = 'in_flight' AND pgcoord_idempotency_held(k.scope, k.key)), pgcoord_now()
		  FROM pgcoord_idempotency_keys k
		 WHERE (k.scope, k.key) > ($1, $2) AND ($3 = '' OR k.scope = $3)
		   AND k.key LIKE $4 ESCAPE '\' AND ($5 = '' OR k.state = $5)
		 ORDER BY k.scope, k.key LIMIT $6`,
		f.AfterScope, f.AfterKey, f.In, likePrefix(f.Prefix), f.State, pageSize+1)
	if err != nil {
		return f, err
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyRow, error) {
		var k idempotency.KeyInfo
		err := r.Scan(&k.Scope, &k.Key, &k.State, &k.Holder, &k.Attempts, &k.RecoveryPoint, &k.Status,
			&k.BodyBytes, &k.CreatedAt, &k.UpdatedAt, &k.CompletedAt, &k.ExpiresAt, &k.Held, &k.DBNow)
		if k.CompletedAt.Equal(time.Unix(0, 0)) {
			k.CompletedAt = time.Time{}
		}
		return keyRow{KeyInfo: k, Age: max(k.DBNow.Sub(k.CreatedAt), 0), Idle: max(k.DBNow.Sub(k.UpdatedAt), 0)}, err
	})
	if err != nil {
		return f, err
	}
	if len(keys) > pageSize {
		keys = keys[:pageSize]
		f.NextScope, f.NextKey = keys[pageSize-1].Scope, keys[pageSize-1].Key
	}
	f.Rows = keys
	return f, nil
}
