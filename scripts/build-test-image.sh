#!/usr/bin/env bash
# Builds a PostgreSQL image for the testcontainers-based tests from Debian's own packages,
# for machines whose Docker engine cannot pull images. Elsewhere you do not need it: the
# tests default to the official postgres image.
#
# Usage: scripts/build-test-image.sh [15|17|ha]  -> image pgcoord-test/postgres:<version>
#   15 is built from Debian 12 (bookworm), 17 from Debian 13 (trixie). The 17 image also
#   carries Debian 13's PgBouncer (1.24), which the pooler leg runs (scripts/start-pgbouncer.sh
#   with PGCOORD_PGBOUNCER_IMAGE): Debian 12's PgBouncer 1.18 exits on a cancel request
#   that races its client's disconnect, which pgx sends whenever a context ends mid-query.
#   ha builds pgcoord-test/patroni:17 for the high-availability cluster of
#   scripts/ha-cluster.sh: Debian 13's PostgreSQL 17, Patroni 4.0, etcd 3.5 and HAProxy 3.0,
#   with no entrypoint of its own (ha-cluster.sh mounts scripts/ha/ and runs its scripts).
#   Not Debian 12's Patroni 3.0.2: a leader frozen past its TTL takes its key back on thawing
#   while another node promotes (fixed in 3.0.3), which loses acknowledged commits in
#   synchronous mode (docs/ha.md).
#   An existing image is reused; FORCE=1 rebuilds it.
# Then run the tests with PGCOORD_TEST_IMAGE=pgcoord-test/postgres:<version>.
#
# The entrypoint behaves like the official image's as far as testcontainers' postgres module
# relies on it: POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB, a leading "postgres"
# argument is dropped and the rest go to the server, and "database system is ready to accept
# connections" is logged twice (by the init-time server, then by the real one).
set -euo pipefail
version=${1:-15}
case $version in
  15) suite=bookworm packages=postgresql-15 ;;
  17) suite=trixie packages=postgresql-17,pgbouncer ;;
  ha) suite=trixie packages=postgresql-17,patroni,etcd-server,haproxy,curl,iproute2,procps ;;
  *) echo "build-test-image: version must be 15, 17 or ha, not '$version'" >&2; exit 2 ;;
esac
image=pgcoord-test/postgres:$version
[[ $version == ha ]] && image=pgcoord-test/patroni:17
# Present, with every package it must carry (an older 17 image lacks PgBouncer).
if [[ ${FORCE:-0} != 1 ]] && docker image inspect "$image" >/dev/null 2>&1 &&
  { [[ $version != 17 ]] || docker run --rm --entrypoint /bin/sh "$image" -c 'command -v pgbouncer' >/dev/null; }; then
  echo "$image: present"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
fi
rootfs=$(mktemp -d -t pgcoord-image.XXXXXX)
trap 'rm -rf "$rootfs" "$rootfs.log"' EXIT
echo "$image: debootstrap $suite with $packages (about two minutes)"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" >"$rootfs.log" 2>&1; then
  tail -n 20 "$rootfs.log" >&2
  exit 1
fi
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/usr/share/doc "$rootfs"/usr/share/man

if [[ $version == ha* ]]; then
  # Debian's postgresql-common created a cluster on install: Patroni makes its own.
  rm -rf "$rootfs"/var/lib/postgresql/1? "$rootfs"/etc/postgresql/1?
  tar -C "$rootfs" --exclude=./proc --exclude=./sys --exclude=./dev -c . |
    docker import -c 'ENV LANG=C.UTF-8' - "$image" >/dev/null
  echo "$image: built"
  exit 0
fi

cat >"$rootfs/usr/local/bin/docker-entrypoint.sh" <<ENTRYPOINT
#!/bin/sh
set -e
bin=/usr/lib/postgresql/$version/bin
ENTRYPOINT
cat >>"$rootfs/usr/local/bin/docker-entrypoint.sh" <<'ENTRYPOINT'
data=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
password=${POSTGRES_PASSWORD:-postgres}
as_postgres() { su postgres -s /bin/sh -c "$1"; }
mkdir -p "$data" /var/run/postgresql
chown -R postgres:postgres "$data" /var/run/postgresql
if [ ! -s "$data/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$password" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres "$bin/initdb -D '$data' -U '$user' --pwfile='$pwfile' -A scram-sha-256 >/dev/null"
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$data/pg_hba.conf"
  as_postgres "$bin/pg_ctl -D '$data' -o \"-c listen_addresses=''\" -w start"
  if [ "$db" != postgres ]; then
    as_postgres "PGPASSWORD='$password' psql -X -q -h /var/run/postgresql -U '$user' -d postgres -c 'CREATE DATABASE \"$db\"'"
  fi
  as_postgres "$bin/pg_ctl -D '$data' -m fast -w stop"
fi
[ "${1:-}" = postgres ] && shift
exec su postgres -s /bin/sh -c "exec $bin/postgres -D '$data' -c listen_addresses='*' $*"
ENTRYPOINT
chmod 755 "$rootfs/usr/local/bin/docker-entrypoint.sh"

tar -C "$rootfs" --exclude=./proc --exclude=./sys --exclude=./dev -c . |
  docker import -c 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
    -c 'ENV LANG=C.UTF-8' -c 'EXPOSE 5432' - "$image" >/dev/null
echo "$image: built"
