# Sourced by `make test`: makes sure the tests have a PostgreSQL server to talk to.
#
#   1. PGCOORD_TEST_DATABASE_URL set: the tests use that database (each test in a schema of
#      its own) and start containers only for the tests that must own a server.
#   2. Otherwise testcontainers starts servers from PGCOORD_TEST_IMAGE (default: the
#      official postgres:17 image). If that image is neither present nor pullable (a
#      machine without registry access), a local image is built from Debian's packages
#      with scripts/build-test-image.sh and used instead.
#
# Containers are reached on 127.0.0.1 unless TESTCONTAINERS_HOST_OVERRIDE says otherwise.

: "${TESTCONTAINERS_HOST_OVERRIDE:=127.0.0.1}"
export TESTCONTAINERS_HOST_OVERRIDE

pgcoord_image=${PGCOORD_TEST_IMAGE:-postgres:17}
if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  if [ -z "${PGCOORD_TEST_DATABASE_URL:-}" ]; then
    echo "test-env: no Docker and no PGCOORD_TEST_DATABASE_URL: database tests will be skipped (or fail, with CI set)" >&2
  else
    echo "test-env: no Docker: tests that need a server of their own will be skipped (or fail, with CI set)" >&2
  fi
elif docker image inspect "$pgcoord_image" >/dev/null 2>&1; then
  :
elif docker pull -q "$pgcoord_image" >/dev/null 2>&1; then
  :
else
  echo "test-env: cannot pull $pgcoord_image; building a local image from Debian's packages" >&2
  "$(dirname "${BASH_SOURCE[0]}")/build-test-image.sh" 15 >&2
  pgcoord_image=pgcoord-test/postgres:15
  # The reaper's image cannot be pulled either; pgtest removes its containers itself.
  export TESTCONTAINERS_RYUK_DISABLED=true
fi
export PGCOORD_TEST_IMAGE=$pgcoord_image
unset pgcoord_image
