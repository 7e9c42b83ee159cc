package pgcoord_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sqlAnswers are the read-only functions: key and channel mappings and lookups. They
// answer for any argument rather than raise — they are called per row inside queries
// (pgcoord_semaphore_held over a queue's rows, some of them not taken) and the planner
// inlines them into their callers — and they write nothing. Each entry is a boolean SQL
// expression that must be true.
var sqlAnswers = map[string][]string{
	// The advisory-lock keys and channels are STRICT: NULL in, NULL out.
	"pgcoord_lock_key":       {`pgcoord_lock_key(NULL) IS NULL`, `pgcoord_lock_key('') IS NOT NULL`},
	"pgcoord_channel":        {`pgcoord_channel(NULL) IS NULL`},
	"pgcoord_singleton_key":  {`pgcoord_singleton_key(NULL, 1) IS NULL`, `pgcoord_singleton_key('j', NULL) IS NULL`},
	"pgcoord_singleton_held": {`pgcoord_singleton_held(NULL, 1) IS NULL`, `NOT pgcoord_singleton_held(pg_backend_pid(), 1)`},
	// No key is held, or known, under a NULL or invalid name.
	"pgcoord_idempotency_held": {
		`pgcoord_idempotency_held(NULL, 'req-1') IS NULL`, `pgcoord_idempotency_held('api', NULL) IS NULL`,
		`NOT pgcoord_idempotency_held('', '')`,
	},
	"pgcoord_idempotency_lookup": {
		`NOT EXISTS (SELECT FROM pgcoord_idempotency_lookup(NULL, 'req-1'))`,
		`NOT EXISTS (SELECT FROM pgcoord_idempotency_lookup('api', NULL))`,
		`EXISTS (SELECT FROM pgcoord_idempotency_lookup('api', 'req-1'))`,
	},
	// No permit is live under a NULL key or token.
	"pgcoord_ratelimit_shadow_refused": {
		`pgcoord_ratelimit_shadow_refused(NULL) IS NULL`, `pgcoord_ratelimit_shadow_refused('nope') IS NULL`,
		`pgcoord_ratelimit_shadow_refused('api') = 0`,
	},
	"pgcoord_semaphore_held": {
		`NOT pgcoord_semaphore_held(NULL, ` + permitToken + `)`, `NOT pgcoord_semaphore_held('tenant:a', NULL)`,
		`NOT pgcoord_semaphore_held('tenant:a', -1)`, `NOT pgcoord_semaphore_held('', 1)`,
		`pgcoord_semaphore_held('tenant:a', ` + permitToken + `)`,
	},
	// A notification's payload for a name: the first 32 hex digits of its SHA-256 (as
	// internal/listen.Tag computes it).
	"pgcoord_wake_tag": {`pgcoord_wake_tag(NULL) IS NULL`, `pgcoord_wake_tag('report') = '845e91831319e89c4d656bdb80c278ac'`},
}

// sqlExempt are the internal helpers that take arguments: they are called only by the
// functions above, after those checked their arguments.
var sqlExempt = map[string]string{
	"pgcoord_refuse":                 "raises the argument errors this test checks",
	"pgcoord_refuse_name":            "raises the argument errors this test checks",
	"pgcoord_name_ok":                "the name check itself (a predicate)",
	"pgcoord_ttl_ok":                 "the TTL check itself (a predicate)",
	"pgcoord_grant_prepare":          "the synchronous_commit check and standby refusal of the granting functions, whose sync_commit cases cover it",
	"pgcoord_lease_args":             "argument checks of the lease functions",
	"pgcoord_lease_grant_args":       "argument checks of the lease functions",
	"pgcoord_job_run_args":           "argument checks of the job functions",
	"pgcoord_semaphore_permit_args":  "argument checks of the semaphore functions",
	"pgcoord_idempotency_args":       "argument checks of the idempotency functions",
	"pgcoord_semaphore_admit":        "the admission step of pgcoord_semaphore_acquire and _next, which check its arguments",
	"pgcoord_fence_record":           "the register update behind pgcoord_fence_check and _assert, whose cases cover its checks",
	"pgcoord_ratelimit_unlogged_tat": "the lookup of an unlogged policy's key by the key-state query, after the key was checked",
	"pgcoord_outbox_lock":            "the enqueue protocol's lock, taken by the outbox write paths after their checks",
	"pgcoord_outbox_insert":          "the batch write of pgcoord_outbox_enqueue_many, which checks its arguments",
	"pgcoord_singleton_release":      "RunSession's unlock of the key pgcoord_singleton_try returned: an UPDATE that matches nothing and an unlock of a key not held change nothing",
	"pgcoord_outbox_bucket":          "the generated bucket column's hash of (topic, key): any text, NULL for NULL (STRICT)",
	"pgcoord_ratelimit_period_ok":    "the period check itself (a predicate)",
	"pgcoord_gc_core":                "pgcoord_gc's collectors of the primitives before rate limits, which check pgcoord_gc's arguments (its cases cover them)",
	"pgcoord_gc_ratelimit":           "a collector pgcoord_gc calls after its core checked the arguments",
	"pgcoord_cron_field_check":       "one field of pgcoord_cron_check, whose cases cover it",
	"pgcoord_cron_every_check":       "the @every form of pgcoord_cron_check, whose cases cover it",
	"pgcoord_cron_refuse":            "raises pgcoord_cron_check's errors",
	"pgcoord_schedule_args":          "argument checks of pgcoord_schedule_create and _update, whose cases cover it",
	"pgcoord_schedule_lock":          "the row lock and clock read of the schedule changes, after their checks",
	"pgcoord_schedule_changed":       "the audit row and notification of a schedule change, written after the change's checks",
	"pgcoord_schedule_begin":         "the start step of pgcoord_schedule_claim and _start, which check its arguments",
	"pgcoord_schedule_jitter":        "an IMMUTABLE hash of (name, tick) into [0, jitter), computed for stored values (schedules TestJitterIsFixedByNameAndTick)",
	"pgcoord_schedule_live_handler":  "a predicate over the handler registrations",
	"pgcoord_schedule_handlers_args": "argument check of the handlers of pgcoord_schedule_claim, _start and _register, whose cases cover it",
	"pgcoord_gc_schedule_handlers":   "a collector pgcoord_gc calls after its core checked the arguments",
	"pgcoord_gc_partition_members":   "a collector pgcoord_gc calls after its core checked the arguments",
	"pgcoord_partition_changed":      "the audit row and notification of a partition group change, written after the change's checks",
	"pgcoord_partition_group_args":   "argument checks of the partition functions, whose cases cover it",
	"pgcoord_partition_lock":         "the group's row lock of the partition functions, after their checks (an unknown group is a case of theirs)",
	"pgcoord_partition_plan":         "the plan of a group whose row the caller locked, after its checks",
	"pgcoord_partition_grant":        "the grants of a group whose row the caller locked, after its checks",
	"pgcoord_partition_resource":     "the fence resource name of a partition: text concatenation, any arguments",
}

// checkCoverage fails for a pgcoord function that takes arguments and is in none of
// sqlFuncs, sqlAnswers and sqlExempt, and for a function of sqlFuncs whose parameters are
// not those of the table, in order.
func checkCoverage(t *testing.T, pool *pgxpool.Pool) {
	rows, err := pool.Query(t.Context(), `
		SELECT p.proname::text,
		       ARRAY(SELECT a.name FROM unnest(p.proargnames, coalesce(p.proargmodes, array_fill('i'::"char", ARRAY[p.pronargs])))
		                                WITH ORDINALITY AS a(name, mode, i)
		              WHERE a.mode IN ('i', 'b', 'v') ORDER BY a.i)
		  FROM pg_proc p
		 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'pgcoord\_%' AND p.pronargs > 0
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	declared, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		name   string
		params []string
	}, error) {
		var d struct {
			name   string
			params []string
		}
		return d, r.Scan(&d.name, &d.params)
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range declared {
		if seen[d.name] {
			t.Errorf("%s is overloaded: give each signature its own name, or the table a way to tell them apart", d.name)
		}
		seen[d.name] = true
		i := slices.IndexFunc(sqlFuncs, func(f sqlFunc) bool { return f.name == d.name })
		switch {
		case i >= 0:
			var names []string
			for _, p := range sqlFuncs[i].params {
				names = append(names, p.name)
			}
			if !slices.Equal(names, d.params) {
				t.Errorf("%s takes (%s), its table entry lists (%s): add the new parameters' valid and bad values",
					d.name, strings.Join(d.params, ", "), strings.Join(names, ", "))
			}
		case sqlAnswers[d.name] != nil || sqlExempt[d.name] != "":
		default:
			t.Errorf("%s(%s) has no entry in sqlFuncs: list the valid and bad values of each parameter "+
				"(or, for an internal helper, add it to sqlExempt with the reason)", d.name, strings.Join(d.params, ", "))
		}
	}
	for _, f := range sqlFuncs {
		if !seen[f.name] {
			t.Errorf("sqlFuncs lists %s, which the schema does not have", f.name)
		}
	}
	for name := range sqlAnswers {
		if !seen[name] {
			t.Errorf("sqlAnswers lists %s, which the schema does not have", name)
		}
	}
	for name := range sqlExempt {
		if !seen[name] {
			t.Errorf("sqlExempt lists %s, which the schema does not have", name)
		}
	}
}
