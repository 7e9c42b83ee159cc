package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcoord/pgcoord/partition"
	"github.com/pgcoord/pgcoord/pgcoord"
)

var (
	groupLabel              = []string{"group"}
	partitionPartitionsDesc = prometheus.NewDesc("pgcoord_partition_partitions",
		"The partition group's partition count.", groupLabel, nil)
	partitionMembersDesc = prometheus.NewDesc("pgcoord_partition_live_members",
		"Members of the partition group whose lease runs, by the database clock (draining ones too).", groupLabel, nil)
	partitionUnownedDesc = prometheus.NewDesc("pgcoord_partition_unowned",
		"Partitions of the group without a live grant: free, or whose holder's grant lapsed.", groupLabel, nil)
	partitionUnownedSecondsDesc = prometheus.NewDesc("pgcoord_partition_unowned_seconds",
		"How long the group's partition longest without a live grant has been without one (since it was released, or since its grant lapsed), by the database clock; 0 when every partition has one.",
		groupLabel, nil)
	partitionGrantsDesc = prometheus.NewDesc("pgcoord_partition_grants",
		"Grants made to the group's partitions so far (each move is one): its rate is the moves per second. A gauge: a resize down drops the removed partitions' counts.",
		groupLabel, nil)
)

func init() {
	register(source{
		name: "partitions",
		descs: []*prometheus.Desc{partitionPartitionsDesc, partitionMembersDesc, partitionUnownedDesc,
			partitionUnownedSecondsDesc, partitionGrantsDesc},
		collect: collectPartitions,
	})
}

func collectPartitions(ctx context.Context, db pgcoord.DBTX, o *Opts) ([]prometheus.Metric, bool, error) {
	groups, err := partition.Groups(ctx, db, "", o.MaxRows)
	if err != nil {
		return nil, false, err
	}
	ms := make([]prometheus.Metric, 0, 5*len(groups))
	for _, g := range groups {
		ms = append(ms,
			gauge(partitionPartitionsDesc, float64(g.Partitions), g.Name),
			gauge(partitionMembersDesc, float64(g.Members), g.Name),
			gauge(partitionUnownedDesc, float64(g.Unowned), g.Name),
			gauge(partitionUnownedSecondsDesc, g.UnownedFor.Seconds(), g.Name),
			gauge(partitionGrantsDesc, float64(g.Grants), g.Name))
	}
	return ms, len(groups) == o.MaxRows, nil
}
