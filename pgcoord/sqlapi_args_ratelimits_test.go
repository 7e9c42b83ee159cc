package pgcoord_test

// sqlRatelimitFuncs holds sqlFuncs' entries for the rate limit functions. The fixture's
// policy 'api' admits 10 a second in bursts of 5.
var sqlRatelimitFuncs = []sqlFunc{
	{name: "pgcoord_ratelimit_set", family: "ratelimits", params: []param{
		nameParam("p_name", "rate limit policy name", `'api2'`),
		limitParam("p_rate", "rate", `1000000000`, 1, 1000000000),
		{name: "p_period", valid: `interval '1 second'`, what: "period",
			bad: bad(`interval '0'`, `interval '-1 second'`, `interval '366 days 1 microsecond'`, `interval '1 mon'`),
			ok:  []string{`interval '1 microsecond'`, `interval '366 days'`}},
		limitParam("p_burst", "burst", `5`, 1, 1000000000),
		{name: "p_shadow", valid: `false`, what: "shadow", ok: []string{`true`}},
		{name: "p_unlogged", valid: `false`, what: "unlogged"},
	}},
	{name: "pgcoord_ratelimit_delete", family: "ratelimits", params: []param{
		nameParam("p_name", "rate limit policy name", `'api'`),
	}},
	{name: "pgcoord_ratelimit_reset", family: "ratelimits", params: []param{
		nameParam("p_policy", "rate limit policy name", `'api'`),
		nameParam("p_key", "rate limit key", `'k1'`),
	}},
	{name: "pgcoord_ratelimit_take", family: "ratelimits", params: []param{
		{name: "p_policies", valid: `ARRAY['api']`, what: "p_policies",
			bad: []badValue{
				{expr: `ARRAY[]::text[]`},
				{expr: `(SELECT array_agg('api'::text) FROM generate_series(1, 17))`},
				{expr: `ARRAY['api', 'api']`, says: "p_keys"},
				{expr: `ARRAY['']`, says: "rate limit policy name"},
				{expr: `ARRAY[NULL]::text[]`, code: "22004", says: "rate limit policy name"},
				{expr: `ARRAY['nope']`, code: "P0002", says: "no rate limit policy"},
			}},
		{name: "p_keys", valid: `ARRAY['k1']`, what: "p_keys",
			bad: []badValue{
				{expr: `ARRAY['k1', 'k2']`},
				{expr: `ARRAY['']`, says: "rate limit key"},
				{expr: `ARRAY[repeat('x', 256)]`, says: "rate limit key"},
				{expr: `ARRAY[NULL]::text[]`, code: "22004", says: "rate limit key"},
			}},
		{name: "p_cost", valid: `1`, what: "cost",
			bad: bad(`0`, `-1`, `6`, `1000000001`), ok: []string{`5`}},
		{name: "p_at_most", valid: `false`, what: "p_at_most", ok: []string{`true`}},
		{name: "p_max_wait", valid: `NULL`, nullOK: true, what: "max wait",
			bad: bad(`interval '-1 second'`, `interval '24 hours 1 microsecond'`, `interval '1 mon'`),
			ok:  []string{`interval '0'`, `interval '24 hours'`}},
	}},
	{name: "pgcoord_ratelimit_take_each", family: "ratelimits", params: []param{
		{name: "p_policies", valid: `ARRAY['api']`, what: "p_policies",
			bad: []badValue{
				{expr: `ARRAY[]::text[]`},
				{expr: `ARRAY['api', 'api']`, says: "p_keys"},
				{expr: `ARRAY['']`, says: "rate limit policy name"},
				{expr: `ARRAY[NULL]::text[]`, code: "22004", says: "rate limit policy name"},
				{expr: `ARRAY['nope']`, code: "P0002", says: "no rate limit policy"},
			}},
		{name: "p_keys", valid: `ARRAY['k1']`, what: "p_keys",
			bad: []badValue{
				{expr: `ARRAY['k1', 'k2']`},
				{expr: `ARRAY['']`, says: "rate limit key"},
				{expr: `ARRAY[NULL]::text[]`, code: "22004", says: "rate limit key"},
			}},
		{name: "p_costs", valid: `ARRAY[1, 2]::bigint[]`, what: "p_costs",
			bad: []badValue{
				{expr: `ARRAY[]::bigint[]`},
				{expr: `(SELECT array_agg(1::bigint) FROM generate_series(1, 1001))`},
				{expr: `ARRAY[1, 0]::bigint[]`, says: "cost"},
				{expr: `ARRAY[1, NULL]::bigint[]`, code: "22004", says: "cost"},
				{expr: `ARRAY[6]::bigint[]`, says: "cost"},
				{expr: `ARRAY[1000000001]::bigint[]`, says: "cost"},
			},
			ok: []string{`ARRAY[5, 5, 5]::bigint[]`}},
		{name: "p_at_most", valid: `false`, what: "p_at_most", ok: []string{`true`}},
		{name: "p_max_wait", valid: `NULL`, nullOK: true, what: "max wait",
			bad: bad(`interval '-1 second'`, `interval '24 hours 1 microsecond'`, `interval '1 mon'`),
			ok:  []string{`interval '0'`, `interval '24 hours'`}},
	}},
	{name: "pgcoord_ratelimit_cancel", family: "ratelimits", params: []param{
		{name: "p_policies", valid: `ARRAY['api']`, what: "p_policies",
			bad: bad(`ARRAY[]::text[]`, `ARRAY['api', 'api']`)},
		{name: "p_keys", valid: `ARRAY['k1']`, what: "p_keys", bad: bad(`ARRAY['k1', 'k2']`)},
		{name: "p_tats", valid: `ARRAY[now()]`, what: "p_tats", bad: bad(`ARRAY[]::timestamptz[]`)},
		{name: "p_bases", valid: `ARRAY[now() - interval '1 second']`, what: "p_bases",
			bad: bad(`ARRAY[]::timestamptz[]`, `ARRAY[now() + interval '1 second']`)},
	}},
	{name: "pgcoord_ratelimit_allow", family: "ratelimits", params: []param{
		func() param {
			p := nameParam("p_policy", "rate limit policy name", `'api'`)
			p.ok = nil // a valid name of no policy raises P0002, as p_policies' case shows
			return p
		}(),
		nameParam("p_key", "rate limit key", `'k1'`),
		{name: "p_cost", valid: `1`, what: "cost", bad: bad(`0`, `6`), ok: []string{`5`}},
	}},
}
