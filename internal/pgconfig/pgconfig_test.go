package pgconfig_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The server applies what Pool sets: application_name and search_path (quoted, so any schema
// name works); and the statement timeout really cancels a slow statement, on the server
// (57014), leaving the connection usable.
func TestPoolSettingsReachTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{
		AppName: "pgcoord-config-test", Schema: `odd "schema" name`, StatementTimeout: 200 * time.Millisecond, MaxConns: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var app, path string
	if err := pool.QueryRow(ctx, `SELECT current_setting('application_name'), current_setting('search_path')`).Scan(&app, &path); err != nil {
		t.Fatal(err)
	}
	if app != "pgcoord-config-test" || path != `"odd ""schema"" name"` {
		t.Fatalf("server sees application_name %q, search_path %q", app, path)
	}
	assertStatementTimeout(t, pool)
	if pool.Config().MaxConns != 2 {
		t.Fatalf("MaxConns = %d", pool.Config().MaxConns)
	}
}

func TestParseErrorsHidePassword(t *testing.T) {
	t.Parallel()
	_, err := pgconfig.Pool("postgres://u:hunter2@host:notaport/db", pgconfig.Options{})
	if err == nil {
		t.Fatal("a bad port parsed")
	}
	if got := err.Error(); strings.Contains(got, "hunter2") {
		t.Fatalf("parse error shows the password: %s", got)
	}
}

// assertStatementTimeout checks that pool's statement timeout (well under 5 s) cancels a
// slow statement on the server: inside a transaction block with SQLSTATE 57014, the
// connection answering the next statement; outside one (it would commit on its own) with a
// timeout error whose outcome is unknown, never a reply.
func assertStatementTimeout(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if _, err := tx.Exec(ctx, `SELECT pg_sleep(5)`); !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("a 5 s statement in a transaction under the statement timeout: %v, want SQLSTATE 57014 (cancelled)", err)
	} else if timedOut, unknown := pgconfig.IsStatementTimeout(err); !timedOut || unknown {
		t.Fatalf("IsStatementTimeout(%v) = %v, %v; want a timeout with a known outcome", err, timedOut, unknown)
	}
	if err := tx.Rollback(ctx); err != nil || conn.Conn().IsClosed() {
		t.Fatalf("the connection after a cancelled statement: %v (closed %v)", err, conn.Conn().IsClosed())
	}

	// Outside a transaction block the statement would commit on its own: no reply counts.
	const marker = "pgcoord-timeout-autocommit"
	_, err = conn.Exec(ctx, `SELECT pg_sleep(60) /* `+marker+` */`)
	if timedOut, unknown := pgconfig.IsStatementTimeout(err); !timedOut || !unknown || !conn.Conn().IsClosed() {
		t.Fatalf("a 60 s statement outside a transaction: %v (timeout %v, unknown %v, closed %v); want a timeout of unknown outcome on a closed connection",
			err, timedOut, unknown, conn.Conn().IsClosed())
	}
	// ...and its cancel request still stopped it on the server, long before its 60 s.
	deadline := time.Now().Add(pgtest.WaitLimit)
	for {
		var running int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`,
			marker+" */").Scan(&running); err != nil {
			t.Fatal(err)
		}
		if running == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the timed-out statement still runs on the server %v later", pgtest.WaitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A context that ends for another reason than the statement timeout (the program stopping)
// interrupts the connection at once, as pgx does by default: a wait for a notification,
// which a cancel request does not end, returns long before the grace a timed-out statement
// gets for its cancel request (5 s).
func TestOtherCancellationsInterruptAtOnce(t *testing.T) {
	pgtest.NeedsSession(t, "LISTEN")
	t.Parallel()
	cfg, err := pgconfig.Pool(pgtest.URL(t), pgconfig.Options{StatementTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "LISTEN pgcoord_config_test"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(200*time.Millisecond, cancel) // while it waits, most likely
	defer stop.Stop()
	t0 := time.Now()
	err = conn.PgConn().WaitForNotification(ctx)
	if err == nil || time.Since(t0) > 3*time.Second {
		t.Fatalf("a cancelled wait for a notification returned %v after %v; want an error at once", err, time.Since(t0))
	}
}

// A password holding '@', ':', '/', '?' or '#' is either parsed right (percent-encoded in a
// URL, quoted in a key=value string) or refused; no parse error, in either form and
// whatever else is wrong with the string, shows the password or a piece of it.
func TestAwkwardPasswordsParseRightOrAreRefused(t *testing.T) {
	t.Parallel()
	enc := strings.NewReplacer("@", "%40", ":", "%3A", "/", "%2F", "?", "%3F", "#", "%23", " ", "%20").Replace
	for _, pw := range []string{"Xq@Wv", "Xq:Wv", "Xq/Wv", "1234/Wv", "12?Wv", "12#Wv", "Xq@Wv:Yz/Uk", "Xq/Wv@Yz", "Xq Wv"} {
		pieces := append([]string{pw, enc(pw)}, strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@:/?# ", r) })...)
		leaks := func(what, text string) {
			t.Helper()
			for _, p := range pieces {
				if strings.Contains(text, p) {
					t.Errorf("%s with password %q shows %q: %s", what, pw, p, text)
				}
			}
		}
		// Percent-encoded: parsed right, and Describe shows no piece of it.
		cfg, err := pgconfig.Pool("postgres://alice:"+enc(pw)+"@db.example:5433/app", pgconfig.Options{})
		if err != nil || cfg.ConnConfig.Password != pw || cfg.ConnConfig.Host != "db.example" || cfg.ConnConfig.Database != "app" {
			t.Errorf("percent-encoded password %q: %v, %+v", pw, err, cfg)
		} else {
			leaks("Describe", pgconfig.Describe(cfg))
		}
		// Quoted in a key=value string: parsed right.
		kv := "host=db.example password='" + strings.ReplaceAll(pw, "'", `\'`) + "' dbname=app"
		if cfg, err := pgconfig.Pool(kv, pgconfig.Options{}); err != nil || cfg.ConnConfig.Password != pw {
			t.Errorf("key=value password %q: %v", pw, err)
		}
		// Raw in a URL: right when nothing of it can move ('?', '#', ':' stay in the user
		// information up to the first '@'), else refused as ambiguous.
		cfg, err = pgconfig.Pool("postgres://alice:"+pw+"@db.example:5433/app", pgconfig.Options{})
		switch {
		case strings.ContainsAny(pw, "@/"):
			if !errors.Is(err, pgconfig.ErrAmbiguousURL) {
				t.Errorf("raw password %q in a URL: %v, want ErrAmbiguousURL", pw, err)
			} else {
				leaks("refusal", err.Error())
			}
		case strings.Contains(pw, " "): // pgx refuses it, saying to write %20
			if err == nil {
				t.Errorf("raw password %q in a URL parsed", pw)
			} else {
				leaks("refusal", err.Error())
			}
		case err != nil || cfg.ConnConfig.Password != pw || cfg.ConnConfig.Host != "db.example":
			t.Errorf("raw password %q in a URL: %v %+v", pw, err, cfg)
		}
		// Malformed elsewhere too: every error hides the password.
		for _, bad := range []string{
			"postgres://alice:" + pw + "@db.example:notaport/app",
			"postgres://alice:" + enc(pw) + "@db.example:notaport/app",
			"postgres://alice:" + enc(pw) + "@db.example/app?sslmode=bogus",
			"postgres://alice:" + enc(pw) + "@db.example/app?connect_timeout=" + enc(pw),
			"host=db.example password = " + pw + " port=notaport",
			"host=db.example password=" + pw + " port=notaport",
			"host=db.example password='" + pw + "' port=notaport",
			"password=" + pw + " host=db.example sslmode=bogus",
		} {
			if _, err := pgconfig.Pool(bad, pgconfig.Options{}); err == nil {
				t.Errorf("%q parsed", bad)
			} else {
				leaks("parse error", err.Error())
			}
		}
	}
}
