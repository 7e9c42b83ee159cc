package pgcoord_test

// sqlIdempotencyFuncs holds sqlFuncs' entries for the idempotency key functions.
var sqlIdempotencyFuncs = []sqlFunc{
	{name: "pgcoord_idempotency_claim", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-2'`),
		{name: "p_fingerprint", valid: `'\x01'::bytea`, what: "idempotency fingerprint",
			bad: bad(`''::bytea`, `decode(repeat('ab', 65), 'hex')`),
			ok:  []string{`decode(repeat('ab', 64), 'hex')`}},
		nameParam("p_holder", "idempotency holder", `'attempt-9'`),
		{name: "p_retention", valid: `interval '1 day'`, what: "idempotency retention",
			bad: bad(`interval '0'`, `interval '-1 day'`, `interval '36501 days'`),
			ok:  []string{`interval '1 microsecond'`, `interval '36500 days'`, `interval '1 mon'`}},
		leaseParam(),
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
	{name: "pgcoord_idempotency_renew", family: "idempotency", params: []param{
		nameParam("p_scope", "idempotency scope", `'api'`),
		nameParam("p_key", "idempotency key", `'req-1'`),
		nameParam("p_holder", "idempotency holder", `'attempt-1'`),
		leaseParam(),
	}},
	{name: "pgcoord_idempotency_release", family: "idempotency", params: []param{
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
}

// leaseParam is the p_lease of the idempotency lease functions: positive, at most an hour.
func leaseParam() param {
	return param{name: "p_lease", valid: `interval '1 minute'`, what: "idempotency lease",
		bad: bad(`interval '0'`, `interval '-1 second'`, `interval '1 hour 1 microsecond'`),
		ok:  []string{`interval '1 microsecond'`, `interval '1 hour'`}}
}
