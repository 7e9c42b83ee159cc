package pgcoord_test

// sqlPartitionFuncs holds sqlFuncs' entries for the functions of partition groups (the
// fixture's group is 'grid', of 8 partitions, with member 'w1' holding them all).
var sqlPartitionFuncs = []sqlFunc{
	{name: "pgcoord_partition_create", family: "partitions", params: []param{
		groupParam(`'grid2'`), limitParam("p_partitions", "partition count", `8`, 1, 65536),
	}},
	{name: "pgcoord_partition_heartbeat", family: "partitions", params: []param{
		knownGroupParam(),
		nameParam("p_member", "partition member", `'w1'`),
		limitParam("p_weight", "partition member weight", `1`, 1, 1000),
		ttlParam("p_ttl", "partition member ttl", `interval '1 hour'`),
		{name: "p_release", valid: `'{}'`, what: "released partitions",
			bad: bad(`array_fill(0, ARRAY[65537])`), ok: []string{`ARRAY[0, 7, 99]`}},
		{name: "p_join", valid: `false`, what: "join", ok: []string{`true`}},
	}},
	{name: "pgcoord_partition_leave", family: "partitions", params: []param{
		knownGroupParam(), nameParam("p_member", "partition member", `'w1'`),
	}},
	{name: "pgcoord_partition_owned", family: "partitions", params: []param{
		knownGroupParam(), nameParam("p_member", "partition member", `'w1'`),
	}},
	{name: "pgcoord_partition_check", family: "partitions", params: []param{
		groupParam(`'grid'`),
		{name: "p_partition", valid: `0`, what: "partition", bad: bad(`-1`, `65536`), ok: []string{`65535`}},
		nameParam("p_member", "partition member", `'w1'`),
		tokenParam("p_token", "fence token", `1`),
	}},
	{name: "pgcoord_partition_drain", family: "partitions", params: []param{
		knownGroupParam(), nameParam("p_member", "partition member", `'w1'`), actorParam(),
	}},
	{name: "pgcoord_partition_rebalance", family: "partitions", params: []param{knownGroupParam(), actorParam()}},
	{name: "pgcoord_partition_resize", family: "partitions", params: []param{
		knownGroupParam(), limitParam("p_partitions", "partition count", `8`, 1, 65536), actorParam(),
	}},
	{name: "pgcoord_key_partition", family: "partitions", params: []param{
		{name: "p_key", valid: `'order:42'`, what: "partition key", ok: []string{`''`, `repeat('é', 10000)`}},
		limitParam("p_partitions", "partition count", `64`, 1, 65536),
	}},
}

// groupParam is a partition group's name: 1 to 200 bytes.
func groupParam(valid string) param {
	return param{name: "p_group", valid: valid, what: "partition group",
		bad: bad(`''`, `repeat('x', 201)`, `E'g\n'`), ok: []string{`repeat('x', 200)`, `'é'`}}
}

// knownGroupParam is the name of a group that must exist: an unknown one raises P0002.
func knownGroupParam() param {
	p := groupParam(`'grid'`)
	p.bad = append(p.bad, badValue{expr: `'nope'`, code: "P0002", says: "does not exist"})
	p.ok = nil
	return p
}
