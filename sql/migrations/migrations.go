// Package migrations holds pgcoord's goose SQL migrations, embedded in the binary.
//
// Most users apply them with pgcoord.Migrate or `pgcoord migrate up`; teams with their own
// migration tool can read them from FS or print them with `pgcoord migrate sql`.
package migrations

import "embed"

// FS holds the migration files (00001_foundation.sql, ...) at its root, in goose format:
// each file has an "-- +goose Up" and an "-- +goose Down" section.
//
//go:embed *.sql
var FS embed.FS
