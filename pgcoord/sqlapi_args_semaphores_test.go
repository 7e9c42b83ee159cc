package pgcoord_test

// sqlSemaphoreFuncs holds sqlFuncs' entries for the semaphore functions.
var sqlSemaphoreFuncs = []sqlFunc{
	{name: "pgcoord_semaphore_acquire", family: "semaphores", params: []param{
		nameParam("p_key", "semaphore key", `'tenant:a'`),
		nameParam("p_holder", "permit holder", `'w9'`),
		limitParam("p_limit", "semaphore limit", `2`, 1, 1000000),
		ttlParam("p_ttl", "permit ttl", `interval '1 minute'`),
		// The case: a negative wait granted or queued.
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
		{name: "p_rate_policy", valid: `NULL`, nullOK: true, what: "rate limit policy",
			bad: []badValue{{expr: `''`}, {expr: `repeat('x', 256)`}, {expr: `'nope'`, code: "P0002"}},
			ok:  []string{`'api'`}},
	}},
}
