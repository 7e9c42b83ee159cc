package pgcoord_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkNoCallerClock checks that no SQL API function lets its caller choose "now": no
// parameter is named p_now, and the call of issue 14 that took over a live lease by
// passing a time a day ahead fails without granting.
func checkNoCallerClock(t *testing.T, pool *pgxpool.Pool, base map[string]string) {
	rows, err := pool.Query(t.Context(), `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%'
		   AND 'p_now' = ANY (p.proargnames)`)
	if err != nil {
		t.Fatal(err)
	}
	withNow, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(withNow) > 0 {
		t.Errorf("functions with a p_now parameter: %v", withNow)
	}
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []string{
		`SELECT count(*), coalesce(string_agg(r::text, ' '), '') FROM pgcoord_lease_acquire('order:42', 'thief', '30 s', '{}', now() + '1 day') r`,
		`SELECT count(*), coalesce(string_agg(r::text, ' '), '') FROM pgcoord_lease_acquire(p_name => 'order:42', p_holder => 'thief', p_ttl => '30 s', p_now => now() + '1 day') r`,
	} {
		refuses(t, conn.Conn(), q, "42883", "does not exist", base)
	}
}

// checkIssueCases runs the calls issue 14 reproduced, as a psql user would type them.
func checkIssueCases(t *testing.T, pool *pgxpool.Pool, base map[string]string) {
	conn, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range []struct{ call, code, says string }{
		// A NULL token returned no row instead of raising.
		{`pgcoord_lease_renew('order:42', 'worker', NULL, '30 seconds')`, "22004", "fence token"},
		{`pgcoord_lease_release('order:42', 'worker', NULL)`, "22004", "fence token"},
		{`pgcoord_lease_check('order:42', 'worker', NULL)`, "22004", "fence token"},
		// A negative wait granted (a key with room) or queued (a full key).
		{`pgcoord_semaphore_acquire('tenant:a', 'w2', 2, '30 seconds', '-5 seconds')`, "22023", "permit wait"},
		{`pgcoord_semaphore_acquire('tenant:full', 'w2', 1, '30 seconds', '-5 seconds')`, "22023", "permit wait"},
		// A NULL claimant claimed the pending message o-2, with claimed_by NULL.
		{`pgcoord_outbox_claim(NULL, 10, 10, 1048576, '30 seconds')`, "22004", "outbox claimant"},
	} {
		q := "SELECT count(*), coalesce(string_agg(r::text, ' '), '') FROM " + c.call + " AS r"
		refuses(t, conn.Conn(), q, c.code, c.says, base)
	}
}
