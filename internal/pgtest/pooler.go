package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// Pooler mode: with EnvPgBouncer set (scripts/start-pgbouncer.sh prints it), the pools that
// Schema, Pool, PoolMax, NewPool (on URL's server) and ExamplePool return reach the server
// through a PgBouncer in transaction mode, so the suite runs a second time as it would
// behind a pooler. What needs a session stays direct: creating and dropping schemas,
// migrations (goose takes a session-level advisory lock), URL (which worker processes and
// the CLI tests connect with).
//
// PgBouncer 1.18 does not forward a search_path startup parameter, so each test schema gets
// a database alias of its own, named like the schema, whose connect_query sets search_path
// on every server connection of that alias: a line in the file EnvPgBouncerInclude names
// (the pooler's config %includes it), followed by RELOAD on the admin console. A role per
// schema (ALTER ROLE ... SET search_path) would work too, but roles are cluster-wide
// objects needing passwords in PgBouncer's auth_file; an alias is one line in a file the
// tests own (kept to the end of the run: see unregisterAlias).
const (
	// EnvPgBouncer names the variable holding the URL of a PgBouncer in transaction mode in
	// front of EnvURL's server; when set, the tests run in pooler mode (BehindPooler).
	EnvPgBouncer = "PGCOORD_TEST_PGBOUNCER"
	// EnvPgBouncerInclude names the variable holding the path of the [databases] file the
	// pooler's configuration includes, to which pooler mode adds an alias per test schema.
	EnvPgBouncerInclude = "PGCOORD_TEST_PGBOUNCER_INCLUDE"
	// PoolerExecMode is the query exec mode of pooler-mode pools. PgBouncer 1.18 does not
	// support protocol-level prepared statements, so pgx's default (which prepares and
	// caches named statements) fails in transaction mode. QueryExecModeCacheDescribe uses
	// the unnamed statement only, each execution in one round trip (Parse, Bind, Execute,
	// Sync) once the statement's description is cached, and encodes arguments by the
	// parameter types the server described. QueryExecModeExec and
	// QueryExecModeSimpleProtocol, which guess the types from the Go values, send the []byte
	// that sqlc generates for jsonb parameters as bytea and fail ("invalid input syntax for
	// type json"); see docs/pgbouncer.md.
	PoolerExecMode = pgx.QueryExecModeCacheDescribe
	// poolerExecModeParam is PoolerExecMode's name in a connection string.
	poolerExecModeParam = "cache_describe"
)

// BehindPooler reports whether the tests run in pooler mode, i.e. whether the pools pgtest
// hands out go through PgBouncer in transaction mode. Tests of features that need a
// session (LISTEN, session-level advisory locks, a stable pg_backend_pid) branch on it.
func BehindPooler() bool { return os.Getenv(EnvPgBouncer) != "" }

// NeedsSession skips t in pooler mode, saying why: for the few tests whose subject by nature
// needs a server session of its own (LISTEN latency, say). A feature that has a fallback
// behind a pooler is tested through the fallback instead, not skipped.
func NeedsSession(t testing.TB, why string) {
	t.Helper()
	if BehindPooler() {
		t.Skip("needs a session: " + why)
	}
}

// NeedsSessionExamples names (a -test.skip pattern) the runnable examples of a package that
// need a session, which Main skips in pooler mode (an example cannot skip itself). Call it
// from TestMain before Main.
func NeedsSessionExamples(pattern string) { shared.sessionExamples = pattern }

// Direct returns a pool on the schema pool reaches, that reaches the server directly, for a
// test's own use of a session (holding a session-level lock, LISTENing to observe a
// notification) beside a pool under test; outside pooler mode it returns pool itself.
func Direct(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	if !BehindPooler() || pool.Config().ConnConfig.Port == poolerUpstream().Port {
		return pool
	}
	direct, err := directPool(pool.Config().ConnConfig.Database, 0)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(direct.Close)
	return direct
}

// NeedsPooler skips t outside pooler mode: for tests of how pgcoord behaves behind
// PgBouncer, which scripts/test-pgbouncer.sh runs.
func NeedsPooler(t testing.TB) {
	t.Helper()
	if !BehindPooler() {
		t.Skip("needs PgBouncer: runs in pooler mode (scripts/test-pgbouncer.sh sets " + EnvPgBouncer + ")")
	}
}

// PoolerURL returns a connection string that reaches schema through the pooler (its search
// path set by the pooler; "" means the upstream database with the default search_path),
// with the pooler's query exec mode, for a test that hands a URL to a worker process or the
// CLI. The alias is removed when t ends. Outside pooler mode it returns URL with
// search_path, which pgconfig and pgx pass to the server at startup.
func PoolerURL(t testing.TB, schema string) string {
	t.Helper()
	direct := URL(t)
	if !BehindPooler() {
		if schema == "" {
			return direct
		}
		return withParams(t, direct, "", map[string]string{"search_path": pgconfig.QuoteIdent(schema)})
	}
	db := ""
	if schema != "" {
		db = registerAlias(t, schema)
		t.Cleanup(func() { unregisterAlias(schema) })
	}
	return withParams(t, os.Getenv(EnvPgBouncer), db, map[string]string{"default_query_exec_mode": poolerExecModeParam})
}

func withParams(t testing.TB, u, db string, params map[string]string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if db != "" {
		parsed.Path = "/" + db
	}
	q := parsed.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// poolerConfig returns the config of a pool reaching schema through the pooler. Its
// RuntimeParams still carry search_path (the pooler drops it: ignore_startup_parameters),
// so code reading the schema from the config works, and pgconfig's check that the server
// resolves the requested schema proves the alias right.
func poolerConfig(schema string, opts pgconfig.Options) (*pgxpool.Config, error) {
	u := os.Getenv(EnvPgBouncer)
	if schema != "" {
		parsed, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		parsed.Path = "/" + schema
		u = parsed.String()
	}
	opts.Schema = schema
	cfg, err := pgconfig.Pool(u, opts)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = PoolerExecMode
	return cfg, nil
}

// aliases counts this process's users of each alias; the file is shared by all the test
// processes of a run, so changes to it are made under an flock.
var aliases struct {
	sync.Mutex
	users map[string]int
}

// registerAlias adds (or reuses) the pooler alias for schema and returns its name.
func registerAlias(t testing.TB, schema string) string {
	t.Helper()
	aliases.Lock()
	defer aliases.Unlock()
	if aliases.users == nil {
		aliases.users = map[string]int{}
	}
	if aliases.users[schema] == 0 {
		if err := editAliases(func(lines map[string]string) {
			lines[schema] = aliasLine(schema)
		}); err != nil {
			t.Fatalf("pgtest: pooler alias for %s: %v", schema, err)
		}
	}
	aliases.users[schema]++
	return schema
}

// unregisterAlias drops a use of schema's alias; the alias itself stays (see below).
func unregisterAlias(schema string) {
	aliases.Lock()
	defer aliases.Unlock()
	aliases.users[schema]--
	if aliases.users[schema] > 0 {
		return
	}
	delete(aliases.users, schema)
	// The alias stays in the pooler's configuration: a RELOAD that drops a database whose
	// server connections are closing has been seen to take PgBouncer 1.18 down in the
	// middle of the pooler leg, between two packages. Its idle server connections close
	// after server_idle_timeout; the include file grows by one line per test schema.
}

func aliasLine(schema string) string {
	c := poolerUpstream()
	return fmt.Sprintf("%s = host=%s port=%d dbname=%s connect_query='SET search_path TO %s'",
		schema, c.Host, c.Port, c.Database, pgconfig.QuoteIdent(schema))
}

var upstream struct {
	once sync.Once
	cfg  *pgx.ConnConfig
}

// poolerUpstream is the server the aliases point at: EnvURL's.
func poolerUpstream() *pgx.ConnConfig {
	upstream.once.Do(func() {
		cfg, err := pgx.ParseConfig(shared.url)
		if err != nil {
			panic("pgtest: " + err.Error())
		}
		upstream.cfg = cfg
	})
	return upstream.cfg
}

// editAliases rewrites the include file under an exclusive flock with edit applied to its
// lines (keyed by alias), then makes the pooler RELOAD it.
func editAliases(edit func(lines map[string]string)) error {
	path := os.Getenv(EnvPgBouncerInclude)
	if path == "" {
		return fmt.Errorf("%s is set but %s is not", EnvPgBouncer, EnvPgBouncerInclude)
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()

	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := map[string]string{}
	var order []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, _, ok := strings.Cut(sc.Text(), " = ")
		if ok {
			lines[name] = sc.Text()
			order = append(order, name)
		}
	}
	edit(lines)
	var b strings.Builder
	for _, name := range order {
		if l, ok := lines[name]; ok {
			b.WriteString(l + "\n")
			delete(lines, name)
		}
	}
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d", filepath.Base(path), os.Getpid()))
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return poolerAdmin("RELOAD")
}

// poolerAdmin runs a command on the pooler's admin console (database "pgbouncer"), which
// speaks only the simple query protocol.
func poolerAdmin(command string) error {
	cfg, err := pgx.ParseConfig(os.Getenv(EnvPgBouncer))
	if err != nil {
		return err
	}
	cfg.Database = "pgbouncer"
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	delete(cfg.RuntimeParams, "search_path")
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pooler admin console: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, command); err != nil {
		return fmt.Errorf("pooler admin console: %s: %w", command, err)
	}
	return nil
}

// directPool opens a short-lived direct pool on schema for migrating it: goose's session
// lock needs a session, which the pooler does not keep.
func directPool(schema string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgconfig.Pool(shared.url, pgconfig.Options{AppName: "pgcoord-test-migrate", Schema: schema, MaxConns: maxConns})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	defer cancel()
	return pgxpool.NewWithConfig(ctx, cfg)
}
