// Package pgtest gives tests a real PostgreSQL server and an isolated, migrated schema.
//
// The server is PGCOORD_TEST_DATABASE_URL when set; otherwise testcontainers-go starts one
// container per test binary from the image in PGCOORD_TEST_IMAGE (default DefaultImage).
// Each test gets its own schema, so tests run in parallel without seeing each other's rows,
// advisory locks or notifications. When no server can be had the test is skipped, except
// with CI set, where it fails: CI must never go green by skipping everything.
//
// A package that uses pgtest calls pgtest.Main from its TestMain, so the container is
// removed when the tests end.
//
// With EnvPgBouncer set (scripts/test-pgbouncer.sh), the tests run in pooler mode: the
// pools pgtest hands out go through PgBouncer in transaction mode, while schemas are
// created and migrated on a direct connection. See BehindPooler and docs/pgbouncer.md.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgcontainer"
	"github.com/pgcoord/pgcoord/pgcoord"
)

const (
	// EnvURL names the variable holding the test database's connection string.
	EnvURL = "PGCOORD_TEST_DATABASE_URL"
	// EnvImage names the variable holding the Postgres image testcontainers runs.
	EnvImage = "PGCOORD_TEST_IMAGE"
	// DefaultImage is the official Postgres image, used when EnvImage is unset.
	DefaultImage = pgcontainer.DefaultImage
)

var shared struct {
	mainCalled bool
	once       sync.Once
	url        string
	err        error
	container  *Server
	admin      *pgxpool.Pool
	// examplePools are the pools ExamplePool handed out, closed by Main.
	examplePools []*pgxpool.Pool
	// sessionExamples is the -test.skip pattern of examples Main skips in pooler mode.
	sessionExamples string
}

// Main runs the tests of a package and then removes the server container it started, if
// any. Call it from TestMain: func TestMain(m *testing.M) { pgtest.Main(m) }.
//
// Runnable examples (see ExamplePool) cannot be skipped, so when no database can be had and
// CI is unset, Main skips them with -test.skip; with CI set they run and fail loudly.
func Main(m *testing.M) {
	shared.mainCalled = true
	flag.Parse()
	if os.Getenv("CI") == "" && connect() != nil {
		addSkip("^Example")
	}
	if BehindPooler() && shared.sessionExamples != "" {
		fmt.Fprintf(os.Stderr, "pgtest: pooler mode: skipping the examples that need a session: %s\n", shared.sessionExamples)
		addSkip(shared.sessionExamples)
	}
	code := m.Run()
	for _, pool := range shared.examplePools {
		dropExampleSchema(pool)
	}
	if shared.admin != nil {
		shared.admin.Close()
	}
	if shared.container != nil {
		_ = shared.container.Terminate()
	}
	os.Exit(code)
}

// addSkip adds pattern to -test.skip, keeping the caller's.
func addSkip(pattern string) {
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		pattern = f.Value.String() + "|" + pattern
	}
	_ = flag.Set("test.skip", pattern)
}

// URL returns the connection string of the shared test server, starting a container on
// first use when EnvURL is unset.
func URL(t testing.TB) string {
	t.Helper()
	if !shared.mainCalled {
		t.Fatal("pgtest: call pgtest.Main from the package's TestMain")
	}
	if err := connect(); err != nil {
		Unavailable(t, err)
	}
	return shared.url
}

// connect finds the shared server once: EnvURL, or a container it starts.
func connect() error {
	shared.once.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			shared.url = u
			return
		}
		s, err := startServer()
		if err != nil {
			shared.err = fmt.Errorf("%s is unset and no container could be started: %w", EnvURL, err)
			return
		}
		shared.container, shared.url = s, s.URL
	})
	return shared.err
}

// ExamplePool returns a pool on a fresh, migrated schema for a runnable Example function,
// which has no *testing.T; Main drops the schema after the tests. It panics when no
// database can be had (Main has already skipped examples then, unless CI is set).
func ExamplePool() *pgxpool.Pool {
	if err := connect(); err != nil {
		panic("pgtest: no database for examples: " + err.Error())
	}
	ctx := context.Background()
	name := "example_" + randomHex(6)
	direct, err := directPool(name, 2)
	if err != nil {
		panic(err)
	}
	defer direct.Close()
	_, err = direct.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(name))
	if err == nil {
		_, err = pgcoord.Migrate(ctx, direct, nil)
	}
	if err != nil {
		panic("pgtest: example schema: " + err.Error())
	}
	cfg, err := poolConfig(shared.url, name, pgconfig.Options{AppName: "pgcoord-example"})
	if err != nil {
		panic(err)
	}
	if BehindPooler() {
		if err := editAliases(func(lines map[string]string) { lines[name] = aliasLine(name) }); err != nil {
			panic("pgtest: example schema: " + err.Error())
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	shared.examplePools = append(shared.examplePools, pool)
	return pool
}

func dropExampleSchema(pool *pgxpool.Pool) {
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	pool.Close() // in pooler mode its alias stays (see unregisterAlias)
	if direct, err := directPool("", 1); err == nil {
		_, _ = direct.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		direct.Close()
	}
}

// Unavailable skips t because a server it needs cannot be had, or fails it when CI is set.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("pgtest: no database in CI: %v", err)
	}
	t.Skipf("pgtest: no database (set %s or run Docker): %v", EnvURL, err)
}

// Schema creates an empty schema for t, dropped when t ends, and returns a pool whose
// connections have it as their search_path, and its name.
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return schemaPool(t, 0)
}

// schemaPool is Schema with a pool of at most maxConns connections (0: pgx's default).
func schemaPool(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	url := URL(t)
	name := SchemaName(t)
	if _, err := adminPool(t, url).Exec(context.Background(), "CREATE SCHEMA "+pgconfig.QuoteIdent(name)); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	return newPool(t, url, name, maxConns), name
}

// Pool returns a pool on a fresh schema for t with pgcoord's migrations applied.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, name := Schema(t)
	migrate(t, pool, name, nil)
	return pool
}

// Migrate applies pgcoord's migrations (up to opts.To, if set) to the schema pool reaches.
// In pooler mode it migrates through a direct connection: goose's session lock needs a
// session, and pgcoord.Migrate refuses a pooler (pgcoord.ErrPooler).
func Migrate(t testing.TB, pool *pgxpool.Pool, opts *pgcoord.MigrateOpts) {
	t.Helper()
	var schema string
	if err := pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	migrate(t, pool, schema, opts)
}

func migrate(t testing.TB, pool *pgxpool.Pool, schema string, opts *pgcoord.MigrateOpts) {
	t.Helper()
	if BehindPooler() {
		direct, err := directPool(schema, 2)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		defer direct.Close()
		pool = direct
	}
	if _, err := pgcoord.Migrate(context.Background(), pool, opts); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
}

// NewPool opens a pool on url with search_path set to schema (if not empty), closed when t
// ends. In pooler mode (see BehindPooler) a pool on URL's server goes through the pooler.
func NewPool(t testing.TB, url, schema string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, url, schema, 0)
}

func newPool(t testing.TB, url, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := poolConfig(url, schema, pgconfig.Options{AppName: "pgcoord-test", MaxConns: maxConns})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if viaPooler(url) && schema != "" {
		registerAlias(t, schema)
		t.Cleanup(func() { unregisterAlias(schema) })
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// viaPooler reports whether pools on url go through the pooler: in pooler mode, those on
// the shared server's URL.
func viaPooler(url string) bool {
	if !BehindPooler() || url == "" || connect() != nil {
		return false
	}
	return url == shared.url // set once, before connect returned
}

// poolConfig is the config of a pool on url and schema: through the pooler if viaPooler.
func poolConfig(url, schema string, opts pgconfig.Options) (*pgxpool.Config, error) {
	if viaPooler(url) {
		return poolerConfig(schema, opts)
	}
	opts.Schema = schema
	return pgconfig.Pool(url, opts)
}

// SchemaName returns a new schema name unique to this call, readable as t's name, and
// drops the schema, if anything created it, when t ends. It does not create the schema.
func SchemaName(t testing.TB) string {
	t.Helper()
	name := newSchemaName(t)
	url := URL(t)
	t.Cleanup(func() {
		if err := dropSchema(adminPool(t, url), name); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}

// dropSchema drops schema and everything in it. A session still at work in it — the
// backend of a worker process the test killed, which runs its statement to the end — may
// take its locks in another order than the drop, and the deadlock detector then aborts
// one of the two: the drop is tried again, up to five times, after the other went on.
func dropSchema(pool *pgxpool.Pool, schema string) error {
	var err error
	for range 5 {
		_, err = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgconfig.QuoteIdent(schema)+" CASCADE")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func newSchemaName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteByte('_')
	b.WriteString(randomHex(4))
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var adminOnce sync.Mutex

func adminPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	adminOnce.Lock()
	defer adminOnce.Unlock()
	if shared.admin == nil {
		cfg, err := pgconfig.Pool(url, pgconfig.Options{AppName: "pgcoord-test-admin", MaxConns: 4})
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		shared.admin, err = pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return shared.admin
}

// Server is a Postgres server in a container that belongs to one test, for tests that stop,
// restart or otherwise disturb the server.
type Server = pgcontainer.Server

// NewServer starts a Postgres container for t, always through testcontainers (whatever
// EnvURL says), removed when t ends. In pooler mode it skips t: t reaches its own server
// directly, never through the pooler, so the run without the pooler has already run it as
// it would run here (the fault suite's processes on a loaded machine, twice over).
func NewServer(t testing.TB) *Server {
	t.Helper()
	if BehindPooler() {
		t.Skip("a server of its own, reached directly and not through the pooler: the runs without the pooler run it")
	}
	s, err := startServer()
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(func() { _ = s.Terminate() })
	return s
}

// Image returns the Postgres image testcontainers runs: EnvImage, or DefaultImage.
func Image() string {
	if img := os.Getenv(EnvImage); img != "" {
		return img
	}
	return DefaultImage
}

func startServer() (*Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return pgcontainer.Start(ctx, Image())
}
