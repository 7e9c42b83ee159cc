package cli_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
	"github.com/pgcoord/pgcoord/semaphore"
)

// Every state-changing command writes an audit row naming --actor (default the OS user
// and host) and the client address the server saw; a dry run writes none, and a name
// with control characters is no actor.
func TestCLIActionsAreAudited(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	if _, err := leases.TryAcquire(ctx, d.pool, "order:1", time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.TryAcquire(ctx, d.pool, "tenant:1", 2, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "1", Payload: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `UPDATE pgcoord_outbox SET state = 'dead'`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"leases", "expire", "order:1", "--dry-run"},
		{"leases", "expire", "order:1"},
		{"semaphores", "set-limit", "tenant:1", "3"},
		{"semaphores", "drain", "tenant:1"},
		{"outbox", "retry", "--all-dead"},
	} {
		if code, _, errOut := d.run(t, append([]string{"--actor", "alice (INC-42)"}, args...)...); code != cli.ExitOK {
			t.Fatalf("%v = %d: %s", args, code, errOut)
		}
	}
	es, err := audit.List(ctx, d.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		if e.Actor != "alice (INC-42)" || e.RemoteAddr == "" {
			t.Errorf("audit row %+v: want actor alice (INC-42) and a client address", e)
		}
		got = append(got, e.Action+" "+e.Target)
	}
	want := "outbox.retry_dead ,semaphore.drain tenant:1,semaphore.set_limit tenant:1,lease.expire order:1"
	if strings.Join(got, ",") != want {
		t.Fatalf("audit rows %q, want %q (newest first, none for the dry run)", strings.Join(got, ","), want)
	}
	code, _, errOut := d.run(t, "--actor", "alice\x1b[2J", "leases", "list")
	if code != cli.ExitUsage || !strings.Contains(errOut, "control characters") {
		t.Fatalf("--actor with an escape sequence = %d %q, want a usage error", code, errOut)
	}
}

// Text the database holds but pgcoord did not check — lease metadata written through
// the SQL API, a message's stored error — reaches a terminal escaped: it can neither
// retitle the window, clear the screen nor print a row of its own.
func TestCLITablesEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	evil := "x\x1b]0;pwned\x07\x1b[2J\r\nfake-lease  held"
	if _, err := d.pool.Exec(ctx, `SELECT pgcoord_lease_acquire('report', 'worker', '1 minute', jsonb_build_object('note', $1::text))`, evil); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "1", Payload: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `UPDATE pgcoord_outbox SET state = 'dead', attempts = 1, last_error = $1`, evil); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"leases", "list"}, {"leases", "show", "report"}, {"outbox", "list", "--state", "dead"}, {"outbox", "show", "1"}} {
		code, out, errOut := d.run(t, args...)
		if code != cli.ExitOK {
			t.Fatalf("%v = %d: %s", args, code, errOut)
		}
		if strings.ContainsAny(out, "\x1b\x07\r") || strings.Contains(out, "\nfake-lease") {
			t.Errorf("%v printed raw control characters:\n%q", args, out)
		}
	}
}

// `leases run` hands its command the lease, not pgcoord's credentials: no PGCOORD_*
// variable (the database URL, the dashboard's token) and no PGPASSWORD.
func TestLeasesRunDoesNotLeakCredentials(t *testing.T) {
	// Not parallel: it sets variables of the test process, which the command inherits.
	t.Setenv("PGCOORD_DATABASE_URL", "postgres://app:hunter2@db.internal/app")
	t.Setenv("PGCOORD_UI_TOKEN", "ui-token-0123456789abcdef0123456789")
	t.Setenv("PGPASSWORD", "hunter3")
	if _, err := exec.LookPath("env"); err != nil {
		t.Fatal(err)
	}
	d := newTestDB(t)
	code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--", "env")
	if code != cli.ExitOK {
		t.Fatalf("leases run -- env = %d: %s", code, errOut)
	}
	for _, leak := range []string{"hunter2", "hunter3", "ui-token", "PGCOORD_DATABASE_URL", "PGPASSWORD"} {
		if strings.Contains(out, leak) {
			t.Errorf("the command's environment holds %q:\n%s", leak, out)
		}
	}
	for _, want := range []string{"PGCOORD_FENCE_TOKEN=", "PGCOORD_LEASE_NAME=job", "PATH="} {
		if !strings.Contains(out, want) {
			t.Errorf("the command's environment lacks %s", want)
		}
	}
}

// A webhook URL's password and query values never reach the terminal or the logs: not in
// a refusal of the URL, not in the relay's start line.
func TestOutboxRelayHidesSinkSecrets(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "outbox", "relay", "--sink", "webhook=ftp://user:hunter2@hooks.example/in?api_key=k3y")
	if code != cli.ExitUsage || strings.Contains(out+errOut, "hunter2") || strings.Contains(out+errOut, "k3y") || !strings.Contains(errOut, "hooks.example") {
		t.Fatalf("relay with an ftp:// sink = %d, stderr %q: want a usage error naming the host, not the secrets", code, errOut)
	}
}

// Every plain line the CLI prints from what the database holds — not only tables — shows
// control characters escaped: a holder written into the table in `leases expire` and
// in `leases run`'s "gave up" line, a job's stored error in `jobs check`, an outbox
// message's payload in `outbox show`. "\x1b[2J" would clear the operator's screen.
func TestCLIPlainOutputEscapesStoredText(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	const evil = "evil\x1b[2J\x1b]0;pwned\x07"
	// The SQL API refuses such a holder; a role that may write the table directly can
	// still store one.
	grant(t, d.pool, "report", "worker", time.Minute, time.Time{})
	if _, err := d.pool.Exec(ctx, `UPDATE pgcoord_leases SET holder = $1 WHERE name = 'report'`, evil); err != nil {
		t.Fatal(err)
	}
	finishTick(t, d.pool, claimTick(t, d.pool, job("broken"), time.Time{}), errors.New(evil))
	if err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Key: "1", Payload: []byte("{\"note\": \"" + evil + "\"}\nline 2")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `UPDATE pgcoord_outbox SET state = 'dead', attempts = 1, last_error = $1`, evil); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"leases", "list"}, {"leases", "show", "report"},
		{"leases", "run", "--name", "report", "--ttl", "10s", "--wait", "0", "--", "true"},
		{"leases", "expire", "report", "--dry-run"}, {"leases", "expire", "report"},
		{"jobs", "check"},
		{"outbox", "list", "--state", "dead"}, {"outbox", "show", "1"},
	} {
		code, out, errOut := d.run(t, args...)
		if code != cli.ExitOK && code != cli.ExitFailure && code != cli.ExitCheck {
			t.Errorf("%v = %d: %s", args, code, errOut)
		}
		if strings.ContainsAny(out+errOut, "\x1b\x07") {
			t.Errorf("%v printed raw control characters:\nstdout %q\nstderr %q", args, out, errOut)
		}
		if !strings.Contains(out+errOut, `evil\x1b[2J`) {
			t.Errorf("%v did not show the stored text escaped:\nstdout %q\nstderr %q", args, out, errOut)
		}
	}
}
