package pgcoord_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgtest"
)

// This file checks, from plain SQL, that every SQL API function refuses bad arguments with
// a clear error, and writes nothing when it does: a NULL where a value is required raises
// SQLSTATE 22004, an empty or oversize name, a non-positive or too long interval, an
// out-of-range number, a non-positive token, a JSON value of the wrong type or arrays of
// different lengths raise 22023 (or the code the function documents), and the message
// ("pgcoord: lease ttl must be positive and at most 24 hours, got -00:00:01") names the
// argument. Each function is called with valid arguments but one, so a refusal is the
// function judging that argument, not a side effect of another.
//
// The table is checked against pg_proc: a function that takes arguments and is neither in
// sqlFuncs nor sqlAnswers nor sqlExempt fails the test, and so does a parameter that is
// added, renamed or removed without the table following, so no function skips this test.

// param is one parameter of a SQL API function, in declaration order.
type param struct {
	name   string     // as declared (p_ttl)
	valid  string     // SQL expression of a valid value, used while another parameter is tested
	what   string     // how the function's error messages name the parameter
	nullOK bool       // NULL is a valid, documented value; otherwise a NULL must raise 22004
	bad    []badValue // values the function must refuse
	ok     []string   // SQL expressions of other values it must accept: the edges of the range
}

// badValue is a value a function must refuse.
type badValue struct {
	expr string // SQL expression
	code string // the SQLSTATE it must raise: 22023 when empty
	says string // what the message must contain: the parameter's what when empty
}

// sqlFunc is a SQL API function and how to call it.
type sqlFunc struct {
	name string
	// family groups functions that touch the same tables: a family's calls run one after
	// another (their transactions would only wait for each other's row locks), families
	// run in parallel.
	family string
	params []param
}

func bad(exprs ...string) []badValue {
	vs := make([]badValue, len(exprs))
	for i, e := range exprs {
		vs[i] = badValue{expr: e}
	}
	return vs
}

// nameParam is a name, holder, key, topic, scope or claimant: 1 to 255 bytes (not
// characters: 'é' is two bytes).
func nameParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`''`, `repeat('x', 256)`, `repeat('é', 128)`),
		ok:  []string{`repeat('x', 255)`, `'é'`}}
}

// ttlParam is an interval in (0, 24 hours]. An interval with months has no fixed length
// ('1 mon -29 days' compares as 24 hours but lasts up to two days from the 1st of a long
// month, and '100 years -35999 days' lasts over a year): it is refused too.
func ttlParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`interval '0'`, `interval '-1 second'`, `interval '24 hours 1 microsecond'`,
			`interval '2 days'`, `interval '1 mon -29 days'`, `interval '100 years -35999 days'`),
		ok: []string{`interval '1 microsecond'`, `interval '24 hours'`, `interval '1 day'`}}
}

// tokenParam is a fence or claim token: positive.
func tokenParam(name, what, valid string) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(`0`, `-1`, `-9223372036854775808`),
		ok:  []string{`9223372036854775807`}}
}

// limitParam is an integer in [lo, hi].
func limitParam(name, what, valid string, lo, hi int64) param {
	return param{name: name, valid: valid, what: what,
		bad: bad(fmt.Sprint(lo-1), fmt.Sprint(hi+1), `-2147483648`),
		ok:  []string{fmt.Sprint(lo), fmt.Sprint(hi)}}
}

func durableParam() param {
	return param{name: "p_durable", valid: `true`, what: "p_durable", ok: []string{`false`}}
}

func syncCommitParam() param {
	return param{name: "p_sync_commit", valid: `NULL`, nullOK: true, what: "synchronous_commit",
		bad: bad(`'off'`, `'local'`, `''`),
		ok:  []string{`'on'`, `'remote_write'`, `'remote_apply'`}}
}

// The fixture's rows (argsFixture), as the valid arguments name them.
const (
	leaseToken  = `(SELECT fence_token FROM pgcoord_leases WHERE name = 'order:42')`
	jobSlot     = `(SELECT scheduled_for FROM pgcoord_job_runs WHERE job = 'nightly')`
	jobToken    = `(SELECT fence_token FROM pgcoord_job_runs WHERE job = 'nightly')`
	permitToken = `(SELECT fence_token FROM pgcoord_semaphore_permits WHERE key = 'tenant:a' AND holder = 'w1')`
	claimToken  = `(SELECT claim_token FROM pgcoord_outbox WHERE key = 'o-1')`
	claimedIDs  = `ARRAY(SELECT id FROM pgcoord_outbox WHERE key = 'o-1')`
)

var sqlFuncs = []sqlFunc{
	// Leases and fences.
	{name: "pgcoord_lease_acquire", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:43'`),
		nameParam("p_holder", "lease holder", `'worker'`),
		ttlParam("p_ttl", "lease ttl", `interval '30 seconds'`),
		{name: "p_metadata", valid: `'{"pid": 7}'`, nullOK: true, what: "lease metadata",
			bad: bad(`'[]'`, `'"text"'`, `'1'`, `'null'`, `jsonb_build_object('x', repeat('x', 9000))`),
			ok:  []string{`'{}'`}},
		syncCommitParam(),
	}},
	{name: "pgcoord_lease_wait", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:42'`),
		nameParam("p_holder", "lease holder", `'waiter'`),
		ttlParam("p_ttl", "lease ttl", `interval '30 seconds'`),
		ttlParam("p_want", "lease wait", `interval '1 minute'`),
		{name: "p_metadata", valid: `'{}'`, nullOK: true, what: "lease metadata", bad: bad(`'[1]'`)},
		syncCommitParam(),
	}},
	{name: "pgcoord_lease_renew", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:42'`),
		nameParam("p_holder", "lease holder", `'worker'`),
		tokenParam("p_fence_token", "fence token", leaseToken),
		ttlParam("p_ttl", "lease ttl", `interval '30 seconds'`),
		durableParam(),
	}},
	{name: "pgcoord_lease_release", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:42'`),
		nameParam("p_holder", "lease holder", `'worker'`),
		tokenParam("p_fence_token", "fence token", leaseToken),
	}},
	{name: "pgcoord_lease_expire", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:42'`),
		{name: "p_by", valid: `'alice'`, nullOK: true, what: "p_by",
			bad: bad(`''`, `repeat('x', 256)`), ok: []string{`repeat('x', 255)`}},
	}},
	{name: "pgcoord_lease_check", family: "leases", params: []param{
		nameParam("p_name", "lease name", `'order:42'`),
		nameParam("p_holder", "lease holder", `'worker'`),
		tokenParam("p_fence_token", "fence token", leaseToken),
	}},
	{name: "pgcoord_fence_check", family: "leases", params: []param{
		nameParam("p_resource", "fence resource", `'order:42'`),
		tokenParam("p_fence_token", "fence token", leaseToken),
	}},
	{name: "pgcoord_fence_assert", family: "leases", params: []param{
		nameParam("p_resource", "fence resource", `'order:42'`),
		tokenParam("p_fence_token", "fence token", leaseToken),
	}},

	// Cron singletons.
	{name: "pgcoord_job_claim", family: "jobs", params: []param{
		nameParam("p_job", "job name", `'nightly'`),
		{name: "p_every", valid: `interval '1 hour'`, what: "job interval",
			// date_bin cannot bin by months: refused as an argument, not by date_bin.
			bad: bad(`interval '0'`, `interval '-1 hour'`, `interval '367 days'`, `interval '1 mon'`,
				`interval '1 year'`),
			ok: []string{`interval '1 microsecond'`, `interval '366 days'`}},
		{name: "p_origin", valid: `NULL`, nullOK: true, what: "job origin",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '-infinity'`),
			ok:  []string{`timestamptz '2001-02-03 04:05:06+00'`}},
		{name: "p_overlap", valid: `'forbid'`, what: "job overlap",
			bad: bad(`''`, `'never'`, `'FORBID'`), ok: []string{`'allow'`, `'replace'`}},
		nameParam("p_holder", "job holder", `'runner-2'`),
		ttlParam("p_ttl", "job ttl", `interval '1 hour'`),
		syncCommitParam(),
	}},
	{name: "pgcoord_job_heartbeat", family: "jobs", params: []param{
		nameParam("p_job", "job name", `'nightly'`),
		{name: "p_scheduled_for", valid: jobSlot, what: "scheduled_for",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '-infinity'`)},
		tokenParam("p_fence_token", "fence token", jobToken),
		ttlParam("p_ttl", "job ttl", `interval '1 hour'`),
	}},
	{name: "pgcoord_job_finish", family: "jobs", params: []param{
		nameParam("p_job", "job name", `'nightly'`),
		{name: "p_scheduled_for", valid: jobSlot, what: "scheduled_for",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '-infinity'`)},
		tokenParam("p_fence_token", "fence token", jobToken),
		// NULL is success; an error of any length is kept to its first 8192 bytes.
		{name: "p_error", valid: `'disk full'`, nullOK: true, what: "p_error",
			ok: []string{`''`, `repeat('e', 100000)`}},
	}},

	// Semaphores.
	{name: "pgcoord_semaphore_acquire", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		nameParam("p_holder", "permit holder", `'w9'`),
		limitParam("p_limit", "semaphore limit", `2`, 1, 1000000),
		ttlParam("p_ttl", "permit ttl", `interval '1 minute'`),
		// The issue's case: a negative wait granted or queued.
		func() param {
			p := ttlParam("p_wait", "permit wait", `NULL`)
			p.nullOK = true
			return p
		}(),
		syncCommitParam(),
	}},
	{name: "pgcoord_semaphore_renew", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		nameParam("p_holder", "permit holder", `'w1'`),
		ttlParam("p_ttl", "permit ttl", `interval '1 minute'`),
		func() param {
			p := tokenParam("p_fence_token", "fence token", permitToken)
			p.nullOK = true // any token of the holder's permit
			return p
		}(),
		durableParam(),
	}},
	{name: "pgcoord_semaphore_release", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		nameParam("p_holder", "permit holder", `'w1'`),
		func() param {
			p := tokenParam("p_fence_token", "fence token", permitToken)
			p.nullOK = true // any token of the holder's permit
			return p
		}(),
	}},
	{name: "pgcoord_semaphore_done", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		nameParam("p_holder", "permit holder", `'w1'`),
		tokenParam("p_fence_token", "fence token", permitToken),
	}},
	{name: "pgcoord_semaphore_drain", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
	}},
	{name: "pgcoord_semaphore_set_limit", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		limitParam("p_limit", "semaphore limit", `3`, 1, 1000000),
		func() param {
			p := limitParam("p_weight", "semaphore weight", `2`, 1, 1000000)
			p.nullOK = true // keep the weight
			return p
		}(),
	}},
	{name: "pgcoord_semaphore_add_demand", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		{name: "p_units", valid: `2`, what: "demand units",
			// A unit count beyond 10^12 is a bug (it would overflow the key's demand).
			bad: bad(`1000000000001`, `-1000000000001`, `9223372036854775807`, `-9223372036854775808`),
			ok:  []string{`0`, `-5`, `1000000000000`, `-1000000000000`}},
		func() param {
			p := limitParam("p_limit", "semaphore limit", `2`, 1, 1000000)
			p.nullOK = true // 1
			return p
		}(),
	}},
	{name: "pgcoord_semaphore_next", family: "semaphores", params: []param{
		nameParam("p_holder", "permit holder", `'w8'`),
		ttlParam("p_ttl", "permit ttl", `interval '1 minute'`),
		{name: "p_keys", valid: `ARRAY['tenant:a']`, nullOK: true, what: "p_keys",
			bad: bad(`ARRAY['']`, `ARRAY[NULL::text]`, `ARRAY['tenant:a', repeat('x', 256)]`,
				`ARRAY(SELECT 'k' || i FROM generate_series(1, 10001) i)`),
			ok: []string{`'{}'::text[]`, `ARRAY(SELECT 'k' || i FROM generate_series(1, 10000) i)`}},
		syncCommitParam(),
	}},

	// Idempotency keys.
	{name: "pgcoord_idempotency_begin", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-2'`),
		{name: "p_fingerprint", valid: `'\x01'::bytea`, what: "idempotency fingerprint",
			bad: bad(`''::bytea`, `decode(repeat('ab', 65), 'hex')`),
			ok:  []string{`decode(repeat('ab', 64), 'hex')`}},
		nameParam("p_holder", "idempotency holder", `'attempt-9'`),
		{name: "p_retention", valid: `interval '1 day'`, what: "idempotency retention",
			bad: bad(`interval '0'`, `interval '-1 day'`, `interval '36501 days'`),
			ok:  []string{`interval '1 microsecond'`, `interval '36500 days'`, `interval '1 mon'`}},
		{name: "p_wait", valid: `NULL`, nullOK: true, what: "idempotency wait",
			bad: bad(`interval '0'`, `interval '-1 second'`, `interval '1 hour 1 microsecond'`),
			ok:  []string{`interval '1 hour'`}},
	}},
	{name: "pgcoord_idempotency_checkpoint", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-1'`),
		nameParam("p_holder", "idempotency holder", `'attempt-1'`),
		nameParam("p_point", "recovery point", `'charged'`),
		{name: "p_data", valid: `'\x0102'::bytea`, nullOK: true, what: "recovery data",
			bad: bad(`decode(repeat('00', 1048577), 'hex')`),
			ok:  []string{`decode(repeat('00', 1048576), 'hex')`, `''::bytea`}},
	}},
	{name: "pgcoord_idempotency_relock", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-1'`),
		nameParam("p_holder", "idempotency holder", `'attempt-1'`),
	}},
	{name: "pgcoord_idempotency_complete", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-1'`),
		nameParam("p_holder", "idempotency holder", `'attempt-1'`),
		limitParam("p_status", "response status", `201`, 100, 999),
		{name: "p_headers", valid: `'{"content-type": "application/json"}'`, nullOK: true, what: "response headers",
			bad: bad(`'[]'`, `'"text"'`, `'null'`, `jsonb_build_object('x', repeat('x', 70000))`),
			ok:  []string{`'{}'`}},
		{name: "p_body", valid: `'\x7b7d'::bytea`, nullOK: true, what: "response body",
			bad: bad(`convert_to(repeat('x', 16777217), 'UTF8')`),
			ok:  []string{`''::bytea`}},
	}},
	{name: "pgcoord_idempotency_gc", family: "idempotency", params: []param{
		limitParam("p_batch", "gc batch", `100`, 1, 100000),
		{name: "p_tombstone", valid: `interval '1 day'`, what: "tombstone retention",
			bad: bad(`interval '-1 second'`, `interval '36501 days'`),
			ok:  []string{`interval '0'`, `interval '36500 days'`}},
	}},

	// Outbox.
	{name: "pgcoord_outbox_idle", family: "outbox", params: []param{
		nameParam("p_claimant", "outbox claimant", `'relay-1'`),
		func() param {
			p := ttlParam("p_ttl", "idle ttl", `interval '30 seconds'`)
			p.nullOK = true // leaves the idle set
			return p
		}(),
	}},
	{name: "pgcoord_outbox_enqueue_bytes", family: "outbox", params: []param{
		nameParam("p_topic", "outbox topic", `'orders'`),
		nameParam("p_key", "outbox key", `'o-3'`),
		{name: "p_payload", valid: `'\x7b7d'::bytea`, what: "outbox payload",
			bad: []badValue{
				{expr: `decode(repeat('00', 1048577), 'hex')`},
				{expr: `'\x7b'::bytea`, code: "22P02", says: "json"}, // declared JSON, is not
			},
			// The largest payload: a JSON string of 1 MiB.
			ok: []string{`convert_to('"' || repeat('x', 1048574) || '"', 'UTF8')`}},
		{name: "p_is_json", valid: `true`, nullOK: true, what: "p_is_json", ok: []string{`false`}},
		{name: "p_headers", valid: `'{"trace": "t-1"}'`, nullOK: true, what: "outbox headers",
			bad: bad(`'[]'`, `'"text"'`, `'null'`, `jsonb_build_object('x', repeat('x', 70000))`)},
		{name: "p_delay", valid: `NULL`, nullOK: true, what: "outbox delay",
			bad: bad(`interval '-1 second'`), ok: []string{`interval '0'`, `interval '1 mon'`}},
	}},
	{name: "pgcoord_outbox_enqueue", family: "outbox", params: []param{
		nameParam("p_topic", "outbox topic", `'orders'`),
		nameParam("p_key", "outbox key", `'o-3'`),
		{name: "p_payload", valid: `'{"n": 3}'`, what: "outbox payload",
			ok: []string{`'null'`, `'[1, 2]'`}},
		{name: "p_headers", valid: `'{}'`, nullOK: true, what: "outbox headers", bad: bad(`'[]'`)},
		{name: "p_delay", valid: `interval '1 minute'`, nullOK: true, what: "outbox delay", bad: bad(`interval '-1 second'`)},
	}},
	{name: "pgcoord_outbox_enqueue_many", family: "outbox", params: []param{
		// Each array must be as long as p_topics; element i of each is message i.
		{name: "p_topics", valid: `ARRAY['orders', 'orders']`, what: "p_topics",
			bad: []badValue{
				{expr: `ARRAY['orders']`, says: "length"},
				{expr: `ARRAY['orders', '']`, says: "topic"},
				{expr: `ARRAY['orders', NULL]`, says: "topic"},
				{expr: `ARRAY['orders', repeat('x', 256)]`, says: "topic"},
			}},
		{name: "p_keys", valid: `ARRAY['o-3', 'o-4']`, what: "p_keys",
			bad: []badValue{
				{expr: `ARRAY['o-3', 'o-4', 'o-5']`, says: "length"},
				{expr: `ARRAY['o-3', '']`, says: "key"},
				{expr: `ARRAY['o-3', NULL]`, says: "key"},
			}},
		{name: "p_payloads", valid: `ARRAY['\x7b7d', '\x']::bytea[]`, what: "p_payloads",
			bad: []badValue{
				{expr: `ARRAY['\x']::bytea[]`, says: "length"},
				{expr: `ARRAY['\x', NULL]::bytea[]`, says: "payload"},
				{expr: `ARRAY['\x', decode(repeat('00', 1048577), 'hex')]`, says: "payload"},
				{expr: `ARRAY['\x7b', '\x']::bytea[]`, code: "22P02", says: "json"}, // declared JSON, is not
			}},
		{name: "p_is_json", valid: `ARRAY[true, NULL]`, what: "p_is_json",
			bad: []badValue{{expr: `ARRAY[true]`, says: "length"}}},
		{name: "p_headers", valid: `ARRAY['{}', NULL]::jsonb[]`, what: "p_headers",
			bad: []badValue{
				{expr: `ARRAY['{}']::jsonb[]`, says: "length"},
				{expr: `ARRAY['{}', '[]']::jsonb[]`, says: "headers"},
				{expr: `ARRAY['{}', jsonb_build_object('x', repeat('x', 70000))]`, says: "headers"},
			}},
		{name: "p_delays", valid: `ARRAY[NULL, interval '1 minute']`, what: "p_delays",
			bad: []badValue{
				{expr: `ARRAY[NULL::interval]`, says: "length"},
				{expr: `ARRAY[NULL, interval '-1 second']`, says: "delay"},
			}},
	}},
	{name: "pgcoord_outbox_claim", family: "outbox", params: []param{
		nameParam("p_claimant", "outbox claimant", `'relay-1'`),
		limitParam("p_limit", "outbox claim limit", `10`, 1, 10000),
		{name: "p_key_limit", valid: `1`, what: "outbox claim key limit",
			bad: bad(`0`, `-1`, `11`), ok: []string{`1`, `10`}},
		{name: "p_max_bytes", valid: `1048576`, what: "outbox claim byte limit",
			bad: bad(`0`, `-1`), ok: []string{`1`, `9223372036854775807`}},
		ttlParam("p_ttl", "outbox claim ttl", `interval '30 seconds'`),
		{name: "p_topics", valid: `ARRAY['orders']`, nullOK: true, what: "outbox claim topics",
			bad: bad(`ARRAY['']`, `ARRAY[NULL::text]`, `ARRAY['orders', repeat('x', 256)]`),
			ok:  []string{`'{}'::text[]`}},
		{name: "p_after_topic", valid: `''`, nullOK: true, what: "p_after_topic", ok: []string{`'orders'`}},
		{name: "p_after_key", valid: `''`, nullOK: true, what: "p_after_key", ok: []string{`'o-1'`}},
	}},
	{name: "pgcoord_outbox_settle", family: "outbox", params: []param{
		tokenParam("p_token", "claim token", claimToken),
		{name: "p_delivered", valid: claimedIDs, nullOK: true, what: "p_delivered"},
		{name: "p_failed", valid: `'{}'::bigint[]`, nullOK: true, what: "p_failed",
			bad: []badValue{{expr: `ARRAY[1::bigint]`, says: "p_errors"}}}, // one id, no error
		{name: "p_errors", valid: `'{}'::text[]`, nullOK: true, what: "p_errors", bad: bad(`ARRAY['boom']`)},
		{name: "p_released", valid: `'{}'::bigint[]`, nullOK: true, what: "p_released"},
		{name: "p_max_attempts", valid: `5`, what: "max attempts", bad: bad(`0`, `-1`), ok: []string{`1`}},
		{name: "p_backoff", valid: `interval '1 second'`, what: "backoff",
			bad: bad(`interval '-1 second'`, `interval '2 minutes'`), ok: []string{`interval '0'`}},
		{name: "p_max_backoff", valid: `interval '1 minute'`, what: "backoff",
			bad: bad(`interval '999 milliseconds'`, `interval '367 days'`), ok: []string{`interval '366 days'`}},
	}},

	// Retention.
	{name: "pgcoord_gc", family: "gc", params: []param{
		{name: "p_older_than", valid: `interval '1 day'`, what: "gc retention",
			bad: bad(`interval '0'`, `interval '999 milliseconds'`, `interval '-1 day'`, `interval '36501 days'`),
			ok:  []string{`interval '1 second'`, `interval '36500 days'`}},
		limitParam("p_batch", "gc batch", `100`, 1, 100000),
		{name: "p_dry_run", valid: `false`, what: "p_dry_run", ok: []string{`true`}},
	}},
}

// sqlAnswers are the read-only functions: key and channel mappings and lookups. They
// answer for any argument rather than raise — they are called per row inside queries
// (pgcoord_semaphore_held over a queue's rows, some of them not taken) and the planner
// inlines them into their callers — and they write nothing. Each entry is a boolean SQL
// expression that must be true.
var sqlAnswers = map[string][]string{
	// The advisory-lock keys and channels are STRICT: NULL in, NULL out.
	"pgcoord_lock_key":             {`pgcoord_lock_key(NULL) IS NULL`, `pgcoord_lock_key('') IS NOT NULL`},
	"pgcoord_channel":              {`pgcoord_channel(NULL) IS NULL`},
	"pgcoord_outbox_lock_key":      {`pgcoord_outbox_lock_key(NULL, 'k') IS NULL`, `pgcoord_outbox_lock_key('t', NULL) IS NULL`},
	"pgcoord_idempotency_lock_key": {`pgcoord_idempotency_lock_key(NULL, 'k') IS NULL`, `pgcoord_idempotency_lock_key('s', NULL) IS NULL`},
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
	"pgcoord_semaphore_held": {
		`NOT pgcoord_semaphore_held(NULL, ` + permitToken + `)`, `NOT pgcoord_semaphore_held('tenant:a', NULL)`,
		`NOT pgcoord_semaphore_held('tenant:a', -1)`, `NOT pgcoord_semaphore_held('', 1)`,
		`pgcoord_semaphore_held('tenant:a', ` + permitToken + `)`,
	},
}

// sqlExempt are the internal helpers that take arguments: they are called only by the
// functions above, after those checked their arguments.
var sqlExempt = map[string]string{
	"pgcoord_refuse":                "raises the argument errors this test checks",
	"pgcoord_refuse_name":           "raises the argument errors this test checks",
	"pgcoord_name_ok":               "the name check itself (a predicate)",
	"pgcoord_ttl_ok":                "the TTL check itself (a predicate)",
	"pgcoord_grant_prepare":         "the synchronous_commit check and standby refusal of the granting functions, whose sync_commit cases cover it",
	"pgcoord_lease_args":            "argument checks of the lease functions",
	"pgcoord_lease_grant_args":      "argument checks of the lease functions",
	"pgcoord_job_run_args":          "argument checks of the job functions",
	"pgcoord_semaphore_permit_args": "argument checks of the semaphore functions",
	"pgcoord_idempotency_args":      "argument checks of the idempotency functions",
	"pgcoord_semaphore_admit":       "the admission step of pgcoord_semaphore_acquire and _next, which check its arguments",
	"pgcoord_fence_record":          "the register update behind pgcoord_fence_check and _assert, whose cases cover its checks",
}

// argsFixture commits the rows the valid arguments name: a held lease and its register,
// a running job, a semaphore key with one permit of two and demand, a full one, an
// idempotency key in flight
// (its attempt's lock is gone), and two outbox keys, one of them claimed.
func argsFixture(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, q := range []string{
		`SELECT count(*) FROM pgcoord_lease_acquire('order:42', 'worker', '1 hour')`,
		`SELECT count(*) FROM pgcoord_fence_check('order:42', ` + leaseToken + `)`,
		`SELECT count(*) FROM pgcoord_job_claim('nightly', '1 hour', NULL, 'forbid', 'runner', '1 hour')`,
		`SELECT count(*) FROM pgcoord_semaphore_set_limit('tenant:a', 2)`,
		`SELECT count(*) FROM pgcoord_semaphore_add_demand('tenant:a', 3)`,
		`SELECT count(*) FROM pgcoord_semaphore_acquire('tenant:a', 'w1', 2, '1 hour')`,
		`SELECT count(*) FROM pgcoord_semaphore_acquire('tenant:full', 'w1', 1, '1 hour')`,
		`SELECT count(*) FROM pgcoord_idempotency_begin('api', 'req-1', '\x01', 'attempt-1', '1 day')`,
		`SELECT count(*) FROM pgcoord_outbox_enqueue('orders', 'o-1', '{"n": 1}')`,
		`SELECT count(*) FROM pgcoord_outbox_enqueue('orders', 'o-2', '{"n": 2}')`,
		`SELECT count(*) FROM pgcoord_outbox_claim('relay-0', 1, 1, 1048576, '1 hour')`, // o-1
	} {
		var n int
		if err := pool.QueryRow(t.Context(), q).Scan(&n); err != nil || n != 1 {
			t.Fatalf("fixture: %s: %d rows, %v", q, n, err)
		}
	}
}

// call is the SQL of a call of f with its valid arguments, but with the values in
// replace, in named notation.
func (f sqlFunc) call(replace map[string]string) string {
	args := make([]string, len(f.params))
	for i, p := range f.params {
		v, ok := replace[p.name]
		if !ok {
			v = p.valid
		}
		args[i] = p.name + " => " + v
	}
	return fmt.Sprintf("SELECT count(*), coalesce(string_agg(r::text, ' '), '') FROM %s(%s) AS r",
		f.name, strings.Join(args, ", "))
}

func TestSQLArgs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	argsFixture(t, pool)

	t.Run("every function is covered", func(t *testing.T) { checkCoverage(t, pool) })
	base := digest(t, pool)

	t.Run("no caller clock", func(t *testing.T) { checkNoCallerClock(t, pool, base) })
	t.Run("issue 14 cases", func(t *testing.T) { checkIssueCases(t, pool, base) })

	t.Run("read-only functions answer", func(t *testing.T) {
		for _, name := range slices.Sorted(maps.Keys(sqlAnswers)) {
			for _, expr := range sqlAnswers[name] {
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT "+expr).Scan(&ok); err != nil || !ok {
					t.Errorf("SELECT %s = %v, %v; want true", expr, ok, err)
				}
			}
		}
	})

	families := map[string][]sqlFunc{}
	for _, f := range sqlFuncs {
		families[f.family] = append(families[f.family], f)
	}
	for _, family := range slices.Sorted(maps.Keys(families)) {
		t.Run(family, func(t *testing.T) {
			t.Parallel()
			conn, err := pool.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			for _, f := range families[family] {
				t.Run(f.name, func(t *testing.T) { checkFunc(t, conn.Conn(), f, base) })
			}
		})
	}
}

// checkFunc calls f with valid arguments, then with each bad value of each parameter in
// turn, the others valid.
func checkFunc(t *testing.T, conn *pgx.Conn, f sqlFunc, base map[string]string) {
	accepts(t, conn, f.call(nil), base)
	for _, p := range f.params {
		if !p.nullOK {
			refuses(t, conn, f.call(map[string]string{p.name: "NULL"}), "22004", p.what, base)
		} else if p.valid != "NULL" {
			accepts(t, conn, f.call(map[string]string{p.name: "NULL"}), base)
		}
		for _, b := range p.bad {
			code, says := b.code, b.says
			if code == "" {
				code = "22023"
			}
			if says == "" {
				says = p.what
			}
			refuses(t, conn, f.call(map[string]string{p.name: b.expr}), code, says, base)
		}
		for _, v := range p.ok {
			accepts(t, conn, f.call(map[string]string{p.name: v}), base)
		}
	}
}

// attempt runs query in a transaction of its own, in a savepoint, and returns its error,
// what it returned, and whether the committed tables differ from base after it: after the
// query if it succeeded, after rolling back to the savepoint if it failed. The
// transaction is always rolled back.
func attempt(t *testing.T, conn *pgx.Conn, query string, base map[string]string) (out string, wrote []string, err error) {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A call that should have been refused and instead waits for a lock must not hang the test.
	if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '60s'; SAVEPOINT call"); err != nil {
		t.Fatal(err)
	}
	var n int64
	err = tx.QueryRow(ctx, query).Scan(&n, &out)
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		t.Fatalf("%s: %v", query, err)
	}
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT call"); rerr != nil {
			t.Fatal(rerr)
		}
	}
	out = fmt.Sprintf("%d row(s) %.300s", n, out)
	now := digest(t, tx)
	for _, table := range slices.Sorted(maps.Keys(now)) {
		if now[table] != base[table] {
			wrote = append(wrote, table)
		}
	}
	return out, wrote, err
}

// refuses checks that query fails with SQLSTATE code, with a message that names what is
// wrong (contains says), and leaves every table as it was.
func refuses(t *testing.T, conn *pgx.Conn, query, code, says string, base map[string]string) {
	t.Helper()
	out, wrote, err := attempt(t, conn, query, base)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		t.Errorf("%s\n\treturned %s, writing %v; want SQLSTATE %s naming %q", query, out, wrote, code, says)
		return
	case !errors.As(err, &pgErr) || pgErr.Code != code:
		t.Errorf("%s\n\tfailed with %v; want SQLSTATE %s naming %q", query, err, code, says)
	case !strings.Contains(pgErr.Message, says) ||
		(code == "22004" || code == "22023") && !strings.HasPrefix(pgErr.Message, "pgcoord: "):
		t.Errorf("%s\n\tfailed with %q; want a message \"pgcoord: ...\" naming %q", query, pgErr.Message, says)
	}
	if len(wrote) > 0 {
		t.Errorf("%s\n\twas refused but changed %v", query, wrote)
	}
}

// accepts checks that query, with valid arguments, raises no error, but for SQLSTATE 55000:
// an idempotency key that the holder named does not hold (valid names of keys that do
// not exist).
func accepts(t *testing.T, conn *pgx.Conn, query string, base map[string]string) {
	t.Helper()
	_, _, err := attempt(t, conn, query, base)
	if pgErr := (*pgconn.PgError)(nil); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "55000") {
		t.Errorf("%s\n\tfailed with %v; valid arguments must be accepted", query, err)
	}
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// digest returns, for each pgcoord table of the current schema, its row count and a hash
// of its rows.
func digest(t *testing.T, q querier) map[string]string {
	t.Helper()
	ctx := t.Context()
	var query string
	err := q.QueryRow(ctx, `
		SELECT string_agg(format('SELECT %L, count(*) || '' '' || md5(coalesce(string_agg(x::text, '','' ORDER BY x::text), '''')) FROM %I x',
		                         tablename, tablename), ' UNION ALL ')
		  FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'pgcoord\_%'`).Scan(&query)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := q.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var table, sum string
		if err := rows.Scan(&table, &sum); err != nil {
			t.Fatal(err)
		}
		out[table] = sum
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
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
