//go:build unix

package integration_test

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// auditRow is one permit's life as the database recorded it.
type auditRow struct {
	key, holder           string
	token                 int64
	inserted, expires     time.Time
	deleted               *time.Time
	reclaimed             bool // deleted as expired, by an admission attempt
	worker                string
	recorded, releasedRec bool // in the worker's history; released there
}

func (a auditRow) end() time.Time {
	if a.deleted != nil && a.deleted.Before(a.expires) {
		return *a.deleted
	}
	return a.expires
}

func checkSemaphoreHistory(t *testing.T, r *semRig, quitAt time.Time, kills int) {
	t.Helper()
	ctx := t.Context()
	rows, err := r.pool.Query(ctx, `
		SELECT a.key, a.holder, a.token, a.inserted_at, a.expires_at, a.deleted_at, coalesce(a.reclaimed, false),
		       coalesce(h.worker, ''), h.key IS NOT NULL, h.ended_at IS NOT NULL,
		       h.key IS NULL OR (h.holder = a.holder AND h.started_at >= a.inserted_at)
		  FROM sem_audit a LEFT JOIN sem_history h USING (key, token)
		 ORDER BY a.key, a.token`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []auditRow
	for rows.Next() {
		var a auditRow
		var consistent bool
		if err := rows.Scan(&a.key, &a.holder, &a.token, &a.inserted, &a.expires, &a.deleted, &a.reclaimed, &a.worker, &a.recorded, &a.releasedRec, &consistent); err != nil {
			t.Fatal(err)
		}
		if !consistent {
			t.Errorf("%s token %d: the worker's record disagrees with the audit (holder %s)", a.key, a.token, a.holder)
		}
		audit = append(audit, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var orphans int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM sem_history h WHERE NOT EXISTS (SELECT FROM sem_audit a WHERE a.key = h.key AND a.token = h.token)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans > 0 {
		t.Errorf("%d permits in the workers' history were never granted", orphans)
	}

	byKey := map[string][]auditRow{}
	for _, a := range audit {
		byKey[a.key] = append(byKey[a.key], a)
	}
	var deadPermits, promptlyChecked int
	var worstLag time.Duration
	for _, k := range semKeys {
		as := byKey[k]
		// Tokens increase in admission order.
		for i := 1; i < len(as); i++ {
			if as[i].inserted.Before(as[i-1].inserted) {
				t.Errorf("%s: token %d admitted at %v, before token %d at %v", k, as[i].token, as[i].inserted, as[i-1].token, as[i-1].inserted)
			}
		}
		// At most semLimit live at any instant.
		type event struct {
			at    time.Time
			delta int
		}
		var evs []event
		for _, a := range as {
			evs = append(evs, event{a.inserted, +1}, event{a.end(), -1})
		}
		slices.SortFunc(evs, func(x, y event) int {
			if c := x.at.Compare(y.at); c != 0 {
				return c
			}
			return x.delta - y.delta
		})
		live, most := 0, 0
		for _, e := range evs {
			live += e.delta
			if live > semLimit {
				t.Errorf("%s: %d permits live at %v, limit %d", k, live, e.at, semLimit)
			}
			most = max(most, live)
		}
		if most < semLimit {
			t.Errorf("%s: never reached its limit: the run did not contend", k)
		}
		// Every permit of a killed worker that it had not released came back after its
		// TTL: deleted after its expiry, as expired, by another worker's admission attempt.
		for _, a := range as {
			worker, _, _ := strings.Cut(a.holder, "/")
			if !r.killed[worker] || a.releasedRec {
				continue
			}
			deadPermits++
			if a.deleted != nil && !a.reclaimed {
				t.Errorf("%s token %d of killed worker %s was deleted while live, though it never released it", k, a.token, worker)
				continue
			}
			if a.deleted == nil {
				t.Errorf("%s token %d of killed worker %s was never reclaimed", k, a.token, worker)
				continue
			}
			if a.deleted.Before(a.expires) {
				t.Errorf("%s token %d of killed worker %s was reclaimed at %v, before it expired at %v", k, a.token, worker, *a.deleted, a.expires)
			}
			if a.expires.Before(quitAt.Add(-semReclaimBound)) {
				promptlyChecked++
				lag := a.deleted.Sub(a.expires)
				worstLag = max(worstLag, lag)
				if lag > semReclaimBound {
					t.Errorf("%s token %d of killed worker %s: its slot came back %v after it expired, more than %v", k, a.token, worker, lag, semReclaimBound)
				}
			}
		}
		t.Logf("%s: %d permits, at most %d live at once", k, len(as), most)
	}
	t.Logf("%d kills; %d permits that killed workers never released, all reclaimed after their expiry (%d while workers ran, the slowest %v after expiry)",
		kills, deadPermits, promptlyChecked, worstLag)
	if deadPermits < 3 {
		t.Errorf("only %d permits of killed workers: the test proves little about reclaim", deadPermits)
	}
}
