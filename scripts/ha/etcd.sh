#!/bin/sh
# Starts this node's etcd member in the background (node.sh at boot; the HA test again
# after it killed the member). HA_NAME and HA_NODES as for node.sh; the data directory is
# kept, so a restarted member rejoins the cluster.
set -eu
members=''
for n in $HA_NODES; do members="$members${members:+,}$n=http://$n:2380"; done
mkdir -p /var/lib/etcd-data /var/log/ha
nohup etcd --name "$HA_NAME" --data-dir /var/lib/etcd-data \
  --listen-peer-urls http://0.0.0.0:2380 --listen-client-urls http://0.0.0.0:2379 \
  --initial-advertise-peer-urls "http://$HA_NAME:2380" --advertise-client-urls "http://$HA_NAME:2379" \
  --initial-cluster "$members" --initial-cluster-state new --initial-cluster-token pgcoord-ha \
  >>/var/log/ha/etcd.log 2>&1 &
echo $! >/var/run/etcd.pid
