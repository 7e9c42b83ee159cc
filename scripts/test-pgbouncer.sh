#!/usr/bin/env bash
# Runs the whole test suite a second time through PgBouncer in transaction mode (the pooler
# leg): starts a PgBouncer in front of the test database (scripts/start-pgbouncer.sh), runs
# `go test ./...` in pgtest's pooler mode with the same reporter as `make test`, and stops
# the pooler. See docs/pgbouncer.md.
#
# Usage: scripts/test-pgbouncer.sh [PACKAGES...]   (default ./...)
#   PGCOORD_TEST_DATABASE_URL  the upstream database (default: the local cluster, started
#                              by scripts/start-local-postgres.sh)
#   GO_TEST_FLAGS              default: -race -count=1 -timeout 20m (as `make test`)
# Needs: apt-get install -y pgbouncer
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${PGCOORD_TEST_DATABASE_URL:-} ]]; then
  PGCOORD_TEST_DATABASE_URL=$(scripts/start-local-postgres.sh)
  export PGCOORD_TEST_DATABASE_URL
fi
# shellcheck source=scripts/test-env.sh
source scripts/test-env.sh
eval "$(scripts/start-pgbouncer.sh "$PGCOORD_TEST_DATABASE_URL")"
stop() {
  local pid
  pid=$(cat "$PGCOORD_TEST_PGBOUNCER_DIR/pgbouncer.pid" 2>/dev/null || true)
  if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
    # PgBouncer writes its log until it has exited: wait (at most 5 s), then remove.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$PGCOORD_TEST_PGBOUNCER_DIR" || true
}
trap stop EXIT
echo "test-pgbouncer: PgBouncer in transaction mode, config and log in $PGCOORD_TEST_PGBOUNCER_DIR" >&2
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags
go test ${GO_TEST_FLAGS:--race -count=1 -timeout 20m} -json "${@:-./...}" | go run ./internal/tools/testreport
