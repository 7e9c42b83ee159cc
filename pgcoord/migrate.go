package pgcoord

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/sql/migrations"
)

// MigrationsFS holds pgcoord's migrations in goose format (00001_foundation.sql, ...), for
// teams that apply SQL with their own migration tool. Migrate applies the same files.
var MigrationsFS fs.FS = migrations.FS

// VersionTable is the goose version table pgcoord records its migrations in, created in the
// same schema as pgcoord's other tables. It is distinct from goose's default
// (goose_db_version) so pgcoord never collides with an application's own goose.
const VersionTable = "pgcoord_migrations"

// ErrSchemaOutdated is returned by CheckSchema when the database lacks migrations this build
// of pgcoord needs.
var ErrSchemaOutdated = errors.New("pgcoord: schema is outdated")

// ErrPooler is wrapped by the error of a call that needs a session when the connection goes
// through a pooler such as PgBouncer in transaction mode: Migrate and Rollback (goose
// serializes migrations with a session-level advisory lock, which such a pooler leaves on
// whichever server connection took it, so the lock would neither exclude a concurrent
// migration nor be released) and singleton.RunSession. The check compares the backend
// process id the server reports with the one the connection was given when it opened; a
// pooler sends its own. Use a direct connection.
var ErrPooler = base.ErrPooler

// Migration is one migration shipped with this build.
type Migration struct {
	Version int64  // from the file name: 1 for 00001_foundation.sql
	Name    string // the file name without version and extension: "foundation"
}

// MigrationResult reports one migration applied or rolled back.
type MigrationResult struct {
	Migration
	Direction string // "up" or "down"
	Duration  time.Duration
}

// MigrateOpts are the options of Migrate. A nil *MigrateOpts means the defaults.
type MigrateOpts struct {
	// To is the version to migrate up to. Zero (the default) means the latest version.
	To int64
}

// RollbackOpts are the options of Rollback. A nil *RollbackOpts rolls back one migration.
type RollbackOpts struct {
	// To is the version to roll back to: every applied migration above it is rolled back.
	To int64
	// All rolls back every migration, removing pgcoord's objects from the schema. It
	// cannot be combined with To.
	All bool
}

// Migrations lists the migrations shipped with this build, in version order.
func Migrations() []Migration {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		panic("pgcoord: embedded migrations unreadable: " + err.Error()) // a build defect, not user input
	}
	var out []Migration
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		out = append(out, Migration{Version: v, Name: m[2]})
	}
	slices.SortFunc(out, func(a, b Migration) int { return int(a.Version - b.Version) })
	return out
}

var migrationFile = regexp.MustCompile(`^(\d+)_(.+)\.sql$`)

// LatestVersion is the highest migration version shipped with this build.
func LatestVersion() int64 {
	ms := Migrations()
	return ms[len(ms)-1].Version
}

// Migrate applies pending migrations, in order, to the schema the pool's connections
// resolve to (the first existing schema on search_path). It returns the migrations it
// applied; none when the schema is current. Concurrent calls against one schema are
// serialized by an advisory lock derived from the schema, so each migration is applied
// once. On failure it returns the migrations applied before the one that failed.
//
// Migrate needs a session (goose holds a session-level advisory lock); run it on a direct
// connection, not through a transaction-mode pooler: it detects one and returns an error
// wrapping ErrPooler before changing anything.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) ([]MigrationResult, error) {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	if opts.To < 0 || opts.To > LatestVersion() {
		return nil, fmt.Errorf("pgcoord: migrate: no version %d; this build has versions 1 to %d", opts.To, LatestVersion())
	}
	p, done, err := newProvider(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer done()
	var res []*goose.MigrationResult
	if opts.To == 0 {
		res, err = p.Up(ctx)
	} else {
		res, err = p.UpTo(ctx, opts.To)
	}
	return results(res, err, "migrate")
}

// Rollback rolls back applied migrations, newest first: one migration by default, every
// migration above opts.To, or all of them with opts.All. Rolling back drops pgcoord's tables
// and the data in them.
func Rollback(ctx context.Context, pool *pgxpool.Pool, opts *RollbackOpts) ([]MigrationResult, error) {
	if opts == nil {
		opts = &RollbackOpts{}
	}
	if opts.All && opts.To != 0 {
		return nil, errors.New("pgcoord: rollback: All and To are mutually exclusive")
	}
	if opts.To < 0 {
		return nil, fmt.Errorf("pgcoord: rollback: no version %d", opts.To)
	}
	p, done, err := newProvider(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer done()
	if !opts.All && opts.To == 0 {
		r, err := p.Down(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			return []MigrationResult{}, nil
		}
		var res []*goose.MigrationResult
		if r != nil {
			res = append(res, r)
		}
		return results(res, err, "rollback")
	}
	res, err := p.DownTo(ctx, opts.To)
	return results(res, err, "rollback")
}

// newProvider opens a goose provider on the pool with pgcoord's version table and a
// migration lock id derived from the target schema, so two schemas migrate in parallel and
// the application's own goose lock never blocks pgcoord's (or the reverse).
func newProvider(ctx context.Context, pool *pgxpool.Pool) (*goose.Provider, func(), error) {
	if pool == nil {
		return nil, nil, errors.New("pgcoord: migrate: nil pool")
	}
	var schema *string
	var lockID int64
	err := pool.QueryRow(ctx,
		`SELECT current_schema(), hashtextextended('pgcoord.migrate:' || coalesce(current_schema(), ''), 0)`,
	).Scan(&schema, &lockID)
	if err != nil {
		return nil, nil, fmt.Errorf("pgcoord: migrate: %w", err)
	}
	if schema == nil {
		return nil, nil, errors.New("pgcoord: migrate: search_path names no existing schema to install into; create the schema or fix search_path")
	}
	if err := checkDirect(ctx, pool); err != nil {
		return nil, nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, nil, fmt.Errorf("pgcoord: migrate: %w", err)
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, nil, fmt.Errorf("pgcoord: migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider("", db, migrations.FS,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true), // never pick up the application's Go migrations
	)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("pgcoord: migrate: %w", err)
	}
	return p, func() { db.Close() }, nil
}

// checkDirect returns an error wrapping ErrPooler when pool's connections go through a
// pooler: the server's pg_backend_pid() differs from the process id the connection got in
// its BackendKeyData.
func checkDirect(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgcoord: migrate: %w", err)
	}
	defer conn.Release()
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return fmt.Errorf("pgcoord: migrate: %w", err)
	}
	if given := conn.Conn().PgConn().PID(); pid != given {
		return fmt.Errorf("pgcoord: migrate: %w (server process %d, connection given %d)", ErrPooler, pid, given)
	}
	return nil
}

func results(res []*goose.MigrationResult, err error, op string) ([]MigrationResult, error) {
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		res = partial.Applied
	}
	out := make([]MigrationResult, 0, len(res))
	for _, r := range res {
		out = append(out, MigrationResult{
			Migration: Migration{Version: r.Source.Version, Name: migrationName(r.Source.Path)},
			Direction: r.Direction,
			Duration:  r.Duration,
		})
	}
	if err != nil {
		return out, fmt.Errorf("pgcoord: %s: %w", op, err)
	}
	return out, nil
}

func migrationName(p string) string {
	if m := migrationFile.FindStringSubmatch(path.Base(p)); m != nil {
		return m[2]
	}
	return path.Base(p)
}

// MigrationState is one migration as CheckSchema found it in the database.
type MigrationState struct {
	Migration
	// AppliedAt is when the migration was applied (goose records it without a zone; it is
	// read in the session's TimeZone); zero if it is pending.
	AppliedAt time.Time
	// Applied reports whether the database has the migration.
	Applied bool
	// Unknown marks a migration the database has but this build does not ship: the
	// database was migrated by a newer pgcoord.
	Unknown bool
}

// SchemaStatus is the migration state of the schema a connection resolves to.
type SchemaStatus struct {
	Schema     string // the schema checked: the first existing schema on search_path
	Current    int64  // the highest applied version; 0 when none is
	Latest     int64  // the highest version this build ships
	Migrations []MigrationState
}

// Pending lists the migrations this build ships that the database has not applied.
func (s SchemaStatus) Pending() []MigrationState {
	var out []MigrationState
	for _, m := range s.Migrations {
		if !m.Applied {
			out = append(out, m)
		}
	}
	return out
}

// CheckSchema reports which migrations the schema db resolves to has applied and which this
// build needs. It returns the status and an error wrapping ErrSchemaOutdated when any
// migration is pending, so a service can refuse to start against an old schema. It reads
// only, in two statements, and is safe inside the caller's transaction.
func CheckSchema(ctx context.Context, db DBTX) (SchemaStatus, error) {
	if db == nil {
		return SchemaStatus{}, errors.New("pgcoord: check schema: nil db")
	}
	st := SchemaStatus{Latest: LatestVersion()}
	var schema *string
	var hasTable bool
	err := db.QueryRow(ctx, `SELECT current_schema(), EXISTS (
		SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = $1)`,
		VersionTable).Scan(&schema, &hasTable)
	if err != nil {
		return st, fmt.Errorf("pgcoord: check schema: %w", err)
	}
	if schema == nil {
		return st, errors.New("pgcoord: check schema: search_path names no existing schema")
	}
	st.Schema = *schema
	applied := map[int64]time.Time{}
	if hasTable {
		rows, err := db.Query(ctx, `SELECT version_id, max(tstamp)::timestamptz FROM `+VersionTable+
			` WHERE version_id > 0 AND is_applied GROUP BY version_id ORDER BY version_id`)
		if err != nil {
			return st, fmt.Errorf("pgcoord: check schema: %w", err)
		}
		for rows.Next() {
			var v int64
			var at time.Time
			if err := rows.Scan(&v, &at); err != nil {
				rows.Close()
				return st, fmt.Errorf("pgcoord: check schema: %w", err)
			}
			applied[v] = at
			st.Current = max(st.Current, v)
		}
		if err := rows.Err(); err != nil {
			return st, fmt.Errorf("pgcoord: check schema: %w", err)
		}
	}
	for _, m := range Migrations() {
		at, ok := applied[m.Version]
		st.Migrations = append(st.Migrations, MigrationState{Migration: m, AppliedAt: at, Applied: ok})
		delete(applied, m.Version)
	}
	for v, at := range applied {
		st.Migrations = append(st.Migrations, MigrationState{Migration: Migration{Version: v}, AppliedAt: at, Applied: true, Unknown: true})
	}
	slices.SortFunc(st.Migrations, func(a, b MigrationState) int { return int(a.Version - b.Version) })
	if p := st.Pending(); len(p) > 0 {
		return st, fmt.Errorf("%w: schema %q is at version %d and this build needs %d (%d pending); run `pgcoord migrate up` or pgcoord.Migrate",
			ErrSchemaOutdated, st.Schema, st.Current, st.Latest, len(p))
	}
	return st, nil
}
