package pgcoord_test

// sqlJobFuncs holds sqlFuncs' entries for the cron singleton (job) functions.
var sqlJobFuncs = []sqlFunc{
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
	// RunOnce's and RunSession's lock (p_session false: transaction-level, undone with the
	// test's transaction).
	{name: "pgcoord_singleton_try", family: "singletons", params: []param{
		nameParam("p_job", "job", `'nightly'`),
		{name: "p_session", valid: `false`, what: "p_session", bad: bad()},
	}},
}
