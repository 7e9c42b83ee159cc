package pgcoord_test

// sqlGCFuncs holds sqlFuncs' entries for the retention function.
var sqlGCFuncs = []sqlFunc{
	{name: "pgcoord_gc", family: "gc", params: []param{
		{name: "p_older_than", valid: `interval '1 day'`, what: "gc retention",
			bad: bad(`interval '0'`, `interval '999 milliseconds'`, `interval '-1 day'`, `interval '36501 days'`),
			ok:  []string{`interval '1 second'`, `interval '36500 days'`}},
		limitParam("p_batch", "gc batch", `100`, 1, 100000),
		{name: "p_dry_run", valid: `false`, what: "p_dry_run", ok: []string{`true`}},
	}},
}
