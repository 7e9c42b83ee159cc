#!/usr/bin/env bash
# A three-node highly available PostgreSQL 17 cluster on this machine's Docker engine:
# Patroni on etcd, each node a container with its etcd member, Patroni and PostgreSQL, and
# HAProxy routing to the primary by Patroni's REST health check.
#
# Usage: scripts/ha-cluster.sh up [sync|strict|async]   (default sync)
#        scripts/ha-cluster.sh status | urls | down
#
#   sync    Patroni's synchronous_mode: one synchronous standby; a failover promotes only it
#   strict  synchronous_mode_strict: commits wait even when no standby is left
#   async   plain asynchronous streaming
#
# `up` prints the two ways clients find the primary, as shell assignments:
#   PGCOORD_HA_URL        every node, target_session_attrs=read-write (the driver picks)
#   PGCOORD_HA_PROXY_URL  HAProxy, which routes to the node Patroni calls primary
# Nodes talk over the network pgcoord-ha; clients reach them over pgcoord-ha-clients (ports
# PGCOORD_HA_PORT+1..3 on 127.0.0.1, HAProxy on PGCOORD_HA_PORT, default 25430), so a node
# cut off from its peers (docker network disconnect pgcoord-ha pgcoord-ha-1) stays reachable
# by clients, as in a real partition. The image is built by scripts/build-test-image.sh ha.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${PGCOORD_HA_IMAGE:-pgcoord-test/patroni:17}
port=${PGCOORD_HA_PORT:-25430}
nodes=(node1 node2 node3)

urls() {
  echo "PGCOORD_HA_URL='postgres://postgres:postgres@127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2)),127.0.0.1:$((port + 3))/postgres?target_session_attrs=read-write&connect_timeout=2&sslmode=disable'"
  echo "PGCOORD_HA_PROXY_URL='postgres://postgres:postgres@127.0.0.1:$port/postgres?connect_timeout=2&sslmode=disable'"
}

# list prints Patroni's view of the cluster (patronictl list with the given flags), asked of
# the first node that answers (a frozen node cannot be asked, a cut-off one cannot read etcd).
list() {
  local i
  for i in 1 2 3; do
    docker exec "pgcoord-ha-$i" patronictl -c /etc/patroni.yml list "$@" 2>/dev/null && return 0
  done
  return 1
}

members() { list -f json; }

# ready reads members' JSON and succeeds when it shows a running leader, two replicas
# streaming and, unless the mode is async, one of them synchronous.
ready() {
  python3 -c '
import json, sys
m = json.load(sys.stdin)
leaders = [x for x in m if x["Role"] == "Leader" and x["State"] == "running"]
replicas = [x for x in m if x["Role"] != "Leader" and x["State"] == "streaming"]
sync = [x for x in m if x["Role"] == "Sync Standby"]
sys.exit(0 if len(leaders) == 1 and len(replicas) == 2 and (sys.argv[1] == "async" or len(sync) == 1) else 1)
' "$1"
}

down() {
  docker rm -f pgcoord-ha-1 pgcoord-ha-2 pgcoord-ha-3 pgcoord-ha-proxy >/dev/null 2>&1 || true
  docker network rm pgcoord-ha pgcoord-ha-clients >/dev/null 2>&1 || true
}

up() {
  local mode=${1:-sync} i started=$SECONDS
  case $mode in sync | strict | async) ;; *) echo "ha-cluster: mode must be sync, strict or async, not '$mode'" >&2; exit 2 ;; esac
  docker image inspect "$image" >/dev/null 2>&1 || scripts/build-test-image.sh ha >&2
  down
  docker network create pgcoord-ha >/dev/null
  docker network create pgcoord-ha-clients >/dev/null
  for i in 1 2 3; do
    docker create --name "pgcoord-ha-$i" --network pgcoord-ha-clients -p "127.0.0.1:$((port + i)):5432" \
      -v "$PWD/scripts/ha:/ha:ro" -e "HA_NAME=node$i" -e "HA_NODES=${nodes[*]}" -e "HA_MODE=$mode" \
      "$image" /ha/node.sh >/dev/null
    docker network connect --alias "node$i" pgcoord-ha "pgcoord-ha-$i"
  done
  docker create --name pgcoord-ha-proxy --network pgcoord-ha-clients -p "127.0.0.1:$port:5000" \
    -v "$PWD/scripts/ha:/ha:ro" "$image" haproxy -W -db -f /ha/haproxy.cfg >/dev/null
  docker start pgcoord-ha-1 pgcoord-ha-2 pgcoord-ha-3 pgcoord-ha-proxy >/dev/null
  # Ready: a leader, two replicas streaming from it (one of them synchronous unless async),
  # and the primary answering through HAProxy.
  until members | ready "$mode" 2>/dev/null &&
    psql -X -q -Atc 'SELECT 1' "postgres://postgres:postgres@127.0.0.1:$port/postgres?connect_timeout=2&sslmode=disable" >/dev/null 2>&1; do
    if ((SECONDS - started > 180)); then
      echo "ha-cluster: not ready within 180 s; Patroni says:" >&2
      members >&2 || docker logs --tail 30 pgcoord-ha-1 >&2
      exit 1
    fi
    sleep 1
  done
  echo "ha-cluster: $mode cluster ready in $((SECONDS - started)) s" >&2
  urls
}

case ${1:-} in
  up) up "${2:-sync}" ;;
  down) down ;;
  status) list ;;
  urls) urls ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
