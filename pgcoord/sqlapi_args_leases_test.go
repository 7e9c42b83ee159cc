package pgcoord_test

// sqlLeaseFuncs holds sqlFuncs' entries for the lease and fence functions.
var sqlLeaseFuncs = []sqlFunc{
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
}
