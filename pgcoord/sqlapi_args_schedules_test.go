package pgcoord_test

// sqlScheduleFuncs holds sqlFuncs' entries for the functions of schedules as rows: those
// users call, then the Scheduler's protocol (the fixture's schedule is 'sched', "0 * * * *"
// in UTC, handler 'h', version 1, not armed yet, with a triggered run pending).
var sqlScheduleFuncs = []sqlFunc{
	{name: "pgcoord_schedule_create", family: "schedules", params: scheduleDefinition(`'sched2'`)},
	{name: "pgcoord_schedule_update", family: "schedules", params: append(scheduleDefinition(`'sched'`)[:12],
		param{name: "p_version", valid: `NULL`, nullOK: true, what: "p_version", ok: []string{`1`, `99`}},
		actorParam())},
	{name: "pgcoord_schedule_pause", family: "schedules", params: []param{
		nameParam("p_name", "schedule name", `'sched'`),
		{name: "p_note", valid: `'maintenance'`, nullOK: true, what: "pause note",
			bad: bad(`repeat('x', 1001)`), ok: []string{`repeat('x', 1000)`}},
		actorParam(),
	}},
	{name: "pgcoord_schedule_resume", family: "schedules", params: []param{nameParam("p_name", "schedule name", `'sched'`), actorParam()}},
	{name: "pgcoord_schedule_delete", family: "schedules", params: []param{nameParam("p_name", "schedule name", `'sched'`), actorParam()}},
	{name: "pgcoord_schedule_trigger", family: "schedules", params: []param{nameParam("p_name", "schedule name", `'sched'`), actorParam()}},
	{name: "pgcoord_schedule_backfill", family: "schedules", params: []param{
		nameParam("p_name", "schedule name", `'sched'`),
		{name: "p_ticks", valid: `ARRAY[timestamptz '2026-01-01 00:00+00']`, what: "backfill ticks",
			bad: bad(`ARRAY[]::timestamptz[]`, `ARRAY[timestamptz 'infinity']`, `ARRAY[NULL]::timestamptz[]`,
				`ARRAY[pgcoord_now() + interval '1 day']`,
				`(SELECT array_agg(timestamptz '2026-01-01' + make_interval(secs => n)) FROM generate_series(1, 10001) n)`),
			ok: []string{`(SELECT array_agg(timestamptz '2026-01-01' + make_interval(secs => n)) FROM generate_series(1, 10000) n)`}},
		actorParam(),
	}},

	// The Scheduler's protocol.
	{name: "pgcoord_schedule_arm", family: "schedules", params: []param{
		nameParam("p_name", "schedule name", `'sched'`),
		versionParam(),
		{name: "p_next", valid: `pgcoord_now() + interval '1 hour'`, nullOK: true, what: "next tick",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '-infinity'`)},
	}},
	{name: "pgcoord_schedule_claim", family: "schedules", params: []param{
		nameParam("p_name", "schedule name", `'sched'`),
		versionParam(),
		{name: "p_from", valid: `timestamptz '2026-01-01 00:00+00'`, what: "first claimed tick",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '-infinity'`, `pgcoord_now() + interval '1 day'`)},
		{name: "p_missed", valid: `0`, what: "missed ticks", bad: bad(`-1`), ok: []string{`3`}},
		{name: "p_ticks", valid: `ARRAY[timestamptz '2026-01-01 00:00+00']`, what: "due ticks",
			bad: bad(`ARRAY[]::timestamptz[]`, `ARRAY[NULL]::timestamptz[]`, `ARRAY[pgcoord_now() + interval '1 day']`,
				`ARRAY[timestamptz '2025-12-31 23:00+00']`,
				`ARRAY[timestamptz '2026-01-01 00:30+00', timestamptz '2026-01-01 00:10+00']`,
				`ARRAY[timestamptz '2026-01-01 00:00+00', timestamptz '2026-01-01 00:00+00']`,
				`(SELECT array_agg(timestamptz '2026-01-01' + make_interval(secs => n)) FROM generate_series(0, 1000) n)`),
			ok: []string{`(SELECT array_agg(timestamptz '2026-01-01' + make_interval(secs => n)) FROM generate_series(0, 999) n)`}},
		{name: "p_next", valid: `timestamptz '2026-01-01 01:00+00'`, nullOK: true, what: "next tick",
			bad: bad(`timestamptz 'infinity'`, `timestamptz '2026-01-01 00:00+00'`)},
		nameParam("p_holder", "schedule holder", `'runner'`),
		handlersParam(),
		ttlParam("p_ttl", "schedule run ttl", `interval '1 minute'`),
	}},
	{name: "pgcoord_schedule_claim_many", family: "schedules", params: []param{
		{name: "p_names", valid: `ARRAY['sched']`, what: "schedule names",
			bad: []badValue{{expr: `ARRAY['sched', 'sched']`}, {expr: `(SELECT array_agg('s' || n) FROM generate_series(1, 1001) n)`},
				{expr: `ARRAY['']`, says: "schedule name"}, {expr: `ARRAY[NULL]::text[]`, code: "22004", says: "schedule name"}}},
		{name: "p_versions", valid: `ARRAY[1]`, what: "schedule versions",
			bad: []badValue{{expr: `ARRAY[1, 1]`}, {expr: `ARRAY[0]`, says: "schedule version"}}, ok: []string{`ARRAY[99]`}},
		{name: "p_froms", valid: `ARRAY[timestamptz '2026-01-01 00:00+00']`, what: "first claimed ticks",
			bad: []badValue{{expr: `ARRAY[]::timestamptz[]`}, {expr: `ARRAY[timestamptz 'infinity']`, says: "first claimed tick"},
				{expr: `ARRAY[pgcoord_now() + interval '1 day']`, says: "first claimed tick"}}},
		{name: "p_missed", valid: `ARRAY[0]`, what: "missed ticks", bad: bad(`ARRAY[-1]`, `ARRAY[0, 0]`), ok: []string{`ARRAY[3]`}},
		{name: "p_firsts", valid: `ARRAY[1]`, what: "due tick slices",
			bad: []badValue{{expr: `ARRAY[1, 1]`}, {expr: `ARRAY[2]`, says: "due tick slices"}, {expr: `ARRAY[0]`, says: "due tick slices"},
				{expr: `ARRAY[NULL]::int[]`, says: "due tick slices"}}},
		{name: "p_counts", valid: `ARRAY[1]`, what: "due tick counts",
			bad: []badValue{{expr: `ARRAY[1, 1]`}, {expr: `ARRAY[0]`, says: "due ticks"}, {expr: `ARRAY[2]`, says: "due tick slices"},
				{expr: `ARRAY[2147483647]`, says: "due tick slices"}}},
		{name: "p_ticks", valid: `ARRAY[timestamptz '2026-01-01 00:00+00']`, what: "due ticks",
			bad: bad(`ARRAY[]::timestamptz[]`, `ARRAY[pgcoord_now() + interval '1 day']`, `ARRAY[timestamptz '2025-12-31 23:00+00']`,
				`array_fill(timestamptz '2026-01-01 00:00+00', ARRAY[1000001])`)},
		{name: "p_nexts", valid: `ARRAY[timestamptz '2026-01-01 01:00+00']`, what: "next ticks",
			bad: []badValue{{expr: `ARRAY[NULL, NULL]::timestamptz[]`}, {expr: `ARRAY[timestamptz 'infinity']`, says: "next tick"},
				{expr: `ARRAY[timestamptz '2026-01-01 00:00+00']`, says: "next tick"}},
			ok: []string{`ARRAY[NULL]::timestamptz[]`}},
		nameParam("p_holder", "schedule holder", `'runner'`),
		handlersParam(),
		ttlParam("p_ttl", "schedule run ttl", `interval '1 minute'`),
	}},
	{name: "pgcoord_schedule_start", family: "schedules", params: []param{
		nameParam("p_name", "schedule name", `'sched'`),
		nameParam("p_holder", "schedule holder", `'runner'`),
		handlersParam(),
		ttlParam("p_ttl", "schedule run ttl", `interval '1 minute'`),
	}},
	{name: "pgcoord_schedule_register", family: "schedules", params: []param{
		nameParam("p_holder", "schedule holder", `'runner'`),
		handlersParam(),
		ttlParam("p_ttl", "handler registration ttl", `interval '1 minute'`),
	}},
	{name: "pgcoord_schedule_unregister", family: "schedules", params: []param{
		nameParam("p_holder", "schedule holder", `'runner'`),
	}},
}

// versionParam is the version of a schedule the Scheduler read: positive.
func versionParam() param {
	return param{name: "p_version", valid: `1`, what: "schedule version", bad: bad(`0`, `-1`), ok: []string{`99`}}
}

// handlersParam is the handlers a Scheduler runs: an array of at most 1000 names (empty,
// or without the fixture's 'h': its run is left to another process).
func handlersParam() param {
	return param{name: "p_handlers", valid: `ARRAY['h']`, what: "schedule handlers",
		bad: bad(`ARRAY['']`, `ARRAY[NULL]::text[]`, `ARRAY['h', repeat('x', 256)]`, `ARRAY[E'h\n']`,
			`(SELECT array_agg('h' || n) FROM generate_series(1, 1001) n)`),
		ok: []string{`ARRAY[]::text[]`, `ARRAY['other']`, `(SELECT array_agg('h' || n) FROM generate_series(1, 1000) n)`}}
}

// scheduleDefinition is the parameters of pgcoord_schedule_create, for the schedule name.
func scheduleDefinition(name string) []param {
	return []param{
		nameParam("p_name", "schedule name", name),
		{name: "p_expr", valid: `'0 * * * *'`, what: "schedule expression", bad: bad(`''`, `'61 0 * * *'`)},
		{name: "p_zone", valid: `'UTC'`, what: "schedule time zone", bad: bad(`'Europe/Berlinn'`)},
		nameParam("p_handler", "schedule handler", `'h'`),
		{name: "p_args", valid: `'{}'`, what: "schedule args",
			bad: bad(`jsonb_build_object('x', repeat('x', 65536))`), ok: []string{`'{"a": [1, 2]}'`}},
		{name: "p_catch_up", valid: `interval '1 hour'`, what: "schedule catch-up window",
			bad: bad(`interval '0'`, `interval '999 milliseconds'`, `interval '367 days'`, `interval '1 mon'`),
			ok:  []string{`interval '1 second'`, `interval '366 days'`}},
		{name: "p_catch_up_policy", valid: `'latest'`, what: "schedule catch-up policy", bad: bad(`''`, `'LATEST'`), ok: []string{`'all'`}},
		{name: "p_overlap", valid: `'forbid'`, what: "schedule overlap", bad: bad(`''`, `'skip'`),
			ok: []string{`'buffer'`, `'allow'`, `'replace'`}},
		{name: "p_jitter", valid: `interval '0'`, what: "schedule jitter",
			bad: bad(`interval '-1 second'`, `interval '24 hours 1 microsecond'`, `interval '1 mon'`),
			ok:  []string{`interval '24 hours'`}},
		{name: "p_deadline", valid: `NULL`, nullOK: true, what: "schedule deadline",
			bad: bad(`interval '0'`, `interval '24 hours 1 microsecond'`), ok: []string{`interval '1 second'`}},
		{name: "p_starts_at", valid: `NULL`, nullOK: true, what: "schedule start",
			bad: bad(`timestamptz 'infinity'`), ok: []string{`timestamptz '2026-01-01 00:00+00'`}},
		{name: "p_ends_at", valid: `NULL`, nullOK: true, what: "schedule end",
			bad: bad(`timestamptz '-infinity'`), ok: []string{`timestamptz '2126-01-01 00:00+00'`}},
		actorParam(),
	}
}

// actorParam is the actor of a change, recorded in pgcoord_audit: NULL means the session
// user.
func actorParam() param {
	return param{name: "p_actor", valid: `'ops'`, nullOK: true, what: "actor", bad: bad(`''`, `repeat('x', 256)`)}
}
