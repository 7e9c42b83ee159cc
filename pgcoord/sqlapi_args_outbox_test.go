package pgcoord_test

// sqlOutboxFuncs holds sqlFuncs' entries for the outbox functions.
var sqlOutboxFuncs = []sqlFunc{
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
		// A group's name, as pgcoord_partition_check takes it (an unknown group has no
		// partitions: a claim of its keys finds none); NULL: no group, every bucket.
		func() param { p := groupParam(`'grid'`); p.nullOK = true; return p }(),
		{name: "p_partitions", valid: `NULL`, nullOK: true, what: "outbox claim partitions",
			bad: append(bad(`ARRAY[-1]`, `ARRAY[65536]`, `ARRAY[NULL::integer]`, `array_fill(0, ARRAY[65537])`),
				// The claimant holds none of them: its view of its grants is behind.
				badValue{expr: `ARRAY[0]`, code: "PGP01", says: "holds none"}),
			ok: []string{`'{}'::integer[]`}},
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
}
