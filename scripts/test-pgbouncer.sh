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
#   PGCOORD_PGBOUNCER_IMAGE    the image whose PgBouncer runs (see scripts/start-pgbouncer.sh);
#                              default pgcoord-test/postgres:17 when it is built, else none:
#                              the host's PgBouncer
# Needs: scripts/build-test-image.sh 17, or apt-get install -y pgbouncer
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${PGCOORD_TEST_DATABASE_URL:-} ]]; then
  PGCOORD_TEST_DATABASE_URL=$(scripts/start-local-postgres.sh)
  export PGCOORD_TEST_DATABASE_URL
fi
# shellcheck source=scripts/test-env.sh
source scripts/test-env.sh
if [[ -z ${PGCOORD_PGBOUNCER_IMAGE+set} ]] && docker image inspect pgcoord-test/postgres:17 >/dev/null 2>&1; then
  export PGCOORD_PGBOUNCER_IMAGE=pgcoord-test/postgres:17
fi
eval "$(scripts/start-pgbouncer.sh "$PGCOORD_TEST_DATABASE_URL")"
stop() {
  if ! eval "$PGCOORD_TEST_PGBOUNCER_ALIVE"; then
    # It exited during the run: keep its log, whose end says why, for the report.
    cp "$PGCOORD_TEST_PGBOUNCER_DIR/pgbouncer.log" /tmp/pgcoord-pgbouncer-died.log 2>/dev/null || true
    echo "test-pgbouncer: PgBouncer exited during the run; its log is in /tmp/pgcoord-pgbouncer-died.log; its end:" >&2
    tail -n 20 /tmp/pgcoord-pgbouncer-died.log >&2 || true
  fi
  # PgBouncer writes its log until it has exited: stop it (waiting), then remove.
  eval "$PGCOORD_TEST_PGBOUNCER_STOP" || true
  rm -rf "$PGCOORD_TEST_PGBOUNCER_DIR" || true
}
trap stop EXIT
echo "test-pgbouncer: PgBouncer in transaction mode (image: ${PGCOORD_PGBOUNCER_IMAGE:-none, the host binary}), config and log in $PGCOORD_TEST_PGBOUNCER_DIR" >&2
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags
go test ${GO_TEST_FLAGS:--race -count=1 -timeout 20m} -json "${@:-./...}" | go run ./internal/tools/testreport
