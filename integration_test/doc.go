// Package integration_test holds pgcoord's cross-package scenarios: the real pgcoord binary
// and worker processes against real PostgreSQL servers that the tests own (started through
// testcontainers, so a test may stop, restart or disturb them).
package integration_test
