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
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

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
	// EnvWorker is set (to any value) in worker processes that a test starts by re-running
	// its own test binary. Main then starts no server: a worker is handed its database
	// by the test that started it, and must not leave a container behind when killed.
	EnvWorker = "PGCOORD_TEST_WORKER"
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
}

// Main runs the tests of a package and then removes the server container it started, if
// any. Call it from TestMain: func TestMain(m *testing.M) { pgtest.Main(m) }.
//
// Runnable examples (see ExamplePool) cannot be skipped, so when no database can be had and
// CI is unset, Main skips them with -test.skip; with CI set they run and fail loudly.
func Main(m *testing.M) {
	shared.mainCalled = true
	flag.Parse()
	if os.Getenv(EnvWorker) != "" {
		os.Exit(m.Run())
	}
	if os.Getenv("CI") == "" && connect() != nil {
		skip := "^Example"
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
			skip = f.Value.String() + "|" + skip // keep the caller's -skip
		}
		_ = flag.Set("test.skip", skip)
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

// URL returns the connection string of the shared test server, starting a container on
// first use when EnvURL is unset.
func URL(t testing.TB) string {
	t.Helper()
	if !shared.mainCalled {
		t.Fatal("pgtest: call pgtest.Main from the package's TestMain")
	}
	if os.Getenv(EnvWorker) != "" {
		t.Fatal("pgtest: a worker process must use the database its test handed it, not start one")
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
	cfg, err := pgconfig.Pool(shared.url, pgconfig.Options{AppName: "pgcoord-example", Schema: name})
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		_, err = pool.Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(name))
	}
	if err == nil {
		_, err = pgcoord.Migrate(ctx, pool, nil)
	}
	if err != nil {
		panic("pgtest: example schema: " + err.Error())
	}
	shared.examplePools = append(shared.examplePools, pool)
	return pool
}

func dropExampleSchema(pool *pgxpool.Pool) {
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	pool.Close()
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
	url := URL(t)
	ctx := context.Background()
	name := SchemaName(t)
	if _, err := adminPool(t, url).Exec(ctx, "CREATE SCHEMA "+pgconfig.QuoteIdent(name)); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	pool := NewPool(t, url, name)
	return pool, name
}

// Pool returns a pool on a fresh schema for t with pgcoord's migrations applied.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := Schema(t)
	if _, err := pgcoord.Migrate(context.Background(), pool, nil); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	return pool
}

// NewPool opens a pool on url with search_path set to schema (if not empty), closed when t
// ends.
func NewPool(t testing.TB, url, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgconfig.Pool(url, pgconfig.Options{AppName: "pgcoord-test", Schema: schema})
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// SchemaName returns a new schema name unique to this call, readable as t's name, and
// drops the schema, if anything created it, when t ends. It does not create the schema.
func SchemaName(t testing.TB) string {
	t.Helper()
	name := newSchemaName(t)
	url := URL(t)
	t.Cleanup(func() {
		_, err := adminPool(t, url).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgconfig.QuoteIdent(name)+" CASCADE")
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
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
// EnvURL says), removed when t ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
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
