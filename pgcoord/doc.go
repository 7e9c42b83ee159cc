// Package pgcoord is the shared vocabulary of the pgcoord toolkit: the DBTX handle every
// statement-scoped call takes, the schema migrations and their checks, name validation and
// the derivation of database-wide advisory-lock keys. It imports no feature package; the
// feature packages (leases, fenced, singleton, dedupe, idempotency, semaphore, outbox) build
// on it.
//
// # Installing the schema
//
// pgcoord is adopted migration-first. Its tables and functions are prefixed pgcoord_ and
// created in the connection's current schema (the first existing schema on search_path), so
// a team can install pgcoord into any schema and two schemas in one database never
// interfere. Apply the migrations with [Migrate], with `pgcoord migrate up`, or by copying
// the SQL from [MigrationsFS] (or `pgcoord migrate sql`) into your own migration tool. At
// startup, [CheckSchema] tells whether the database has every migration this build needs.
//
// # Time
//
// pgcoord judges every expiry, due time and TTL by the database's clock: its SQL reads time
// only through pgcoord_now() (the transaction's start) and pgcoord_clock() (the current
// instant), and no SQL API argument and no Go option lets a caller choose "now". Clocks of
// the machines running the application never matter. `pgcoord doctor` reports a schema
// whose two clock functions were replaced.
//
// # Retention
//
// [GC] (and `pgcoord gc`) collects what pgcoord no longer needs — lease rows and fence
// registers idle for longer than the retention (30 days by default), expired permits,
// idle semaphore keys, old job runs, expired dedupe claims and idempotency keys, delivered
// messages and inbox records — so that per-entity names (a lease per order, a register per
// resource) do not grow the tables without bound. Run it periodically (a daily cron job).
//
// # Guarantees
//
//   - Migrations run through goose with pgcoord's own version table (pgcoord_migrations)
//     and an advisory lock derived from the schema, so they never collide with the
//     application's own goose migrations, and concurrent Migrate calls against one schema
//     apply each migration once.
//   - Each migration runs in its own transaction: a failed migration leaves the schema at
//     the previous version.
//   - Collection never lets a fence token repeat or a stale one through: tokens come from
//     one schema-wide counter, and what a collected lease or register knew moves to the
//     register of the same name and to a retired floor (see [GC] for the one write the
//     floor may refuse: one with a grant older than the retention, to a resource without
//     a fence register).
//   - Advisory-lock keys are derived from (install schema, name) inside the database by
//     pgcoord_lock_key, so the Go library and plain SQL callers compute the same key, and two
//     schemas never share one.
//
// # Failure modes
//
//   - A database whose schema is behind this build: [CheckSchema] returns
//     [ErrSchemaOutdated] with the versions it has and needs. Feature calls against missing
//     tables fail with the server's "relation does not exist" error.
//   - Migrating requires a session: goose holds a session-level advisory lock while it
//     works, which a transaction-mode pooler (PgBouncer) cannot keep. [Migrate] and
//     [Rollback] detect a pooler and refuse with [ErrPooler]; run migrations on a direct
//     connection (see docs/pgbouncer.md).
//   - Connected to a standby: the feature packages' grants, renewals and releases fail
//     with an error wrapping [ErrReadOnly] (see docs/failover.md for what survives a
//     failover, and the SyncCommit option of each grant).
//   - [GC] stopped by its context or a failed batch returns what it removed so far with
//     the error; every batch it finished stays committed (when given a pool), and running
//     it again continues.
//   - search_path names no existing schema: [Migrate] refuses with a clear error before
//     creating anything.
package pgcoord
