package pgcoord_test

// sqlCronFuncs holds sqlFuncs' entries for the schedule validators of migration 00015:
// they return nothing, write nothing, and raise for a bad expression or zone. Their full
// tables of cases are in internal/cronspec/sqlcheck_test.go.
var sqlCronFuncs = []sqlFunc{
	{name: "pgcoord_cron_check", family: "cron", params: []param{
		{name: "p_expr", valid: `'0 0 * * *'`, what: "schedule expression",
			bad: []badValue{
				{expr: `''`, says: "at column 1 (expression): it is empty"},
				{expr: `'61 0 * * *'`, says: "at column 1 (minute): 61 is above the maximum 59"},
				{expr: `'0 0 30 2 *'`, says: "never fires"},
				{expr: `repeat('*', 256)`, says: "over the limit of 255"},
			},
			ok: []string{`'@every 1h'`, `'0 0 0 29 2 *'`}},
	}},
	{name: "pgcoord_zone_check", family: "cron", params: []param{
		{name: "p_zone", valid: `'Europe/Paris'`, what: "schedule time zone",
			bad: bad(`''`, `'Mars/Olympus'`, `'europe/paris'`, `repeat('x', 65)`),
			ok:  []string{`'UTC'`}},
	}},
}
