#!/bin/sh
# One node of scripts/ha-cluster.sh's cluster, run as the container's command: an etcd
# member in the background and Patroni (managing PostgreSQL) in the foreground.
#   HA_NAME   this node's name on the cluster network (node1)
#   HA_NODES  every node's name ("node1 node2 node3"): etcd's members, Patroni's DCS hosts
#   HA_MODE   sync (synchronous_mode), strict (synchronous_mode_strict) or async
# Restarting the container (a rolling restart, a killed node started again) keeps etcd's
# and PostgreSQL's data: the node rejoins as a member and as a replica (pg_rewind).
set -eu
hosts=''
for n in $HA_NODES; do hosts="$hosts${hosts:+,}$n:2379"; done
case $HA_MODE in
  sync) sync=true strict=false ;;
  strict) sync=true strict=true ;;
  async) sync=false strict=false ;;
  *) echo "node.sh: HA_MODE must be sync, strict or async, not '$HA_MODE'" >&2; exit 2 ;;
esac

/ha/etcd.sh

bin_dir=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)

# Patroni's timing: the leader key lives ttl seconds; a leader that cannot renew it within
# retry_timeout demotes itself (loop_wait + 2*retry_timeout <= ttl; 20 is Patroni's minimum).
cat >/etc/patroni.yml <<YAML
scope: pgcoord-ha
name: $HA_NAME
restapi:
  listen: 0.0.0.0:8008
  connect_address: $HA_NAME:8008
etcd3:
  hosts: $hosts
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 300
        wal_log_hints: "on"
        wal_keep_size: 256MB
        hot_standby: "on"
  initdb:
    - encoding: UTF8
    - data-checksums
    - auth: scram-sha-256
  pg_hba:
    - local all all trust
    - host replication replicator all scram-sha-256
    - host all all all scram-sha-256
postgresql:
  listen: 0.0.0.0:5432
  connect_address: $HA_NAME:5432
  data_dir: /var/lib/postgresql/ha
  bin_dir: $bin_dir
  pgpass: /tmp/pgpass
  # A node that cannot rewind to the new leader's timeline (pg_rewind fails, or the
  # histories diverged past what it can mend) is rebuilt from the leader instead of being
  # left half-rewound.
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: replicator, password: replicator}
    rewind: {username: postgres, password: postgres}
YAML
chmod 644 /etc/patroni.yml
mkdir -p /var/lib/postgresql /var/run/postgresql
chown postgres:postgres /var/lib/postgresql /var/run/postgresql
# Patroni becomes the container's PID 1 (setpriv execs, it does not fork): as PID 1 it reaps
# the processes that end up re-parented to it, the postmaster among them. Under a shell or su
# a stopped postmaster stays a zombie and Patroni waits for it forever.
export HOME=/var/lib/postgresql
exec setpriv --reuid=postgres --regid=postgres --init-groups patroni /etc/patroni.yml
