#!/usr/bin/env bash
# Starts this machine's PostgreSQL cluster (Debian's postgresql-common layout) for the tests
# and prints the connection URL for PGCOORD_TEST_DATABASE_URL on stdout.
#
# Usage: scripts/start-local-postgres.sh [VERSION [CLUSTER [PORT]]]   (default: 15 main 5432)
# TCP logins use the password "postgres" for the postgres role (set here), so the cluster's
# default scram-sha-256 pg_hba rules for 127.0.0.1 work unchanged.
set -euo pipefail
version=${1:-15}
cluster=${2:-main}
port=${3:-5432}
db=pgcoord_test

if ! pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1==v && $2==c {found=1} END {exit !found}'; then
  pg_createcluster "$version" "$cluster" --port "$port" >&2
fi
port=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1==v && $2==c {print $3}')
status=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1==v && $2==c {print $4}')
if [[ $status != online* ]]; then
  # stdout carries only the URL: pg_ctlcluster's notes (e.g. "Removed stale pid file.") go to stderr.
  pg_ctlcluster "$version" "$cluster" start >&2
fi
psql_as_postgres() { runuser -u postgres -- psql -X -q -p "$port" -v ON_ERROR_STOP=1 "$@"; }
# The tests create and drop a schema of pgcoord's objects per test, many at once; a DROP
# SCHEMA (or a migration) locks every object it touches, and the default lock table (64
# per connection) runs out ("out of shared memory") when a few dozen run together.
# And two packages' tests run at once (go test's -p), each with pools of its own and
# worker processes with theirs: the default 100 connections ran out once in CI ("too many
# clients already" in internal/bench's TestRunLeases, 2026-12-06).
restart=false
if (($(psql_as_postgres -tAc "SHOW max_locks_per_transaction") < 256)); then
  psql_as_postgres -c "ALTER SYSTEM SET max_locks_per_transaction = 256" >/dev/null
  restart=true
fi
if (($(psql_as_postgres -tAc "SHOW max_connections") < 300)); then
  psql_as_postgres -c "ALTER SYSTEM SET max_connections = 300" >/dev/null
  restart=true
fi
if $restart; then
  pg_ctlcluster "$version" "$cluster" restart >&2
fi
psql_as_postgres -c "ALTER ROLE postgres PASSWORD 'postgres'" >/dev/null
if [[ $(psql_as_postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'") != 1 ]]; then
  psql_as_postgres -c "CREATE DATABASE $db" >/dev/null
fi
echo "postgres://postgres:postgres@127.0.0.1:$port/$db?sslmode=disable"
