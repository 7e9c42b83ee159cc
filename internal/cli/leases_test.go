package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

// leaseDB is a migrated schema of its own for one test, and the CLI flags that reach it.
type leaseDB struct {
	pool  *pgxpool.Pool
	flags []string
}

func newLeaseDB(t *testing.T) leaseDB {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	pgtest.Migrate(t, pool, nil)
	return leaseDB{pool: pool, flags: []string{"--database-url", pgtest.URL(t), "--schema", schema}}
}

// run runs pgcoord against the test's schema.
func (d leaseDB) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return run(t, append(slices.Clone(d.flags), args...)...)
}

type result struct {
	code        int
	out, errOut string
	elapsed     time.Duration
}

// start runs pgcoord against the test's schema in the background, with ctx.
func (d leaseDB) start(ctx context.Context, args ...string) <-chan result {
	ch := make(chan result, 1)
	all := append(slices.Clone(d.flags), args...)
	go func() {
		var out, errOut bytes.Buffer
		t0 := time.Now()
		code := cli.Run(ctx, all, &out, &errOut)
		ch <- result{code, out.String(), errOut.String(), time.Since(t0)}
	}()
	return ch
}

// await returns the result of a background run, failing the test if it takes longer than d.
func await(t *testing.T, ch <-chan result, d time.Duration) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("pgcoord did not exit within %v", d)
		return result{}
	}
}

// waitFor polls cond until it is true, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

func fileExists(path string) func() bool {
	return func() bool { _, err := os.Stat(path); return err == nil }
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// grant acquires name for holder through the API, at now (the database clock when zero),
// failing the test on error.
func grant(t *testing.T, pool *pgxpool.Pool, name, holder string, ttl time.Duration, now time.Time) leases.Lease {
	t.Helper()
	var l leases.Lease
	var err error
	pgtest.At(t, pool, now, func() {
		l, err = leases.TryAcquire(context.Background(), pool, name, ttl, &leases.AcquireOpts{Holder: holder})
	})
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return l
}

func getInfo(t *testing.T, pool *pgxpool.Pool, name string) leases.Info {
	t.Helper()
	i, err := leases.Get(context.Background(), pool, name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return i
}

// listedLease is one element of `leases list --json`.
type listedLease struct {
	Name       string            `json:"name"`
	State      string            `json:"state"`
	Holder     *string           `json:"holder"`
	FenceToken int64             `json:"fence_token"`
	Metadata   map[string]string `json:"metadata"`
	AcquiredAt *string           `json:"acquired_at"`
	RenewedAt  *string           `json:"renewed_at"`
	ExpiresAt  *string           `json:"expires_at"`
	ReleasedAt *string           `json:"released_at"`
	ExpiredBy  *string           `json:"expired_by"`
	TTLLeftMS  int64             `json:"ttl_left_ms"`
	// Counters across grants.
	NearMisses     int64   `json:"near_misses"`
	LastNearMissAt *string `json:"last_near_miss_at"`
	ForcedExpiries int64   `json:"forced_expiries"`
	DBNow          *string `json:"db_now"`
}

var leaseKeys = []string{"acquired_at", "db_now", "expired_by", "expires_at", "fence_token", "forced_expiries", "holder",
	"last_near_miss_at", "metadata", "name", "near_misses", "released_at", "renewed_at", "state", "ttl_left_ms"}

// listJSON runs `leases list --json` with extra args and decodes it, checking every
// object has exactly the documented keys.
func (d leaseDB) listJSON(t *testing.T, args ...string) []listedLease {
	t.Helper()
	code, out, errOut := d.run(t, append([]string{"--json", "leases", "list"}, args...)...)
	if code != cli.ExitOK {
		t.Fatalf("leases list --json %v = %d, stderr %q", args, code, errOut)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil || raw == nil {
		t.Fatalf("leases list --json printed %q, not a JSON array: %v", out, err)
	}
	for _, m := range raw {
		if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, leaseKeys) {
			t.Fatalf("lease object has keys %v, want %v", keys, leaseKeys)
		}
	}
	var ls []listedLease
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatal(err)
	}
	return ls
}

func names(ls []listedLease) []string {
	var ns []string
	for _, l := range ls {
		ns = append(ns, l.Name)
	}
	return ns
}

func parseTime(t *testing.T, s *string) time.Time {
	t.Helper()
	if s == nil {
		t.Fatal("time is null")
	}
	tm, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil || !strings.HasSuffix(*s, "Z") {
		t.Fatalf("time %q is not RFC 3339 UTC: %v", *s, err)
	}
	return tm
}

// list shows held, expired and free leases as such, by the database clock, with --held and
// --expired selecting, in table and JSON form.
func TestLeasesListStates(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	ctx := context.Background()
	heldGrant := grant(t, d.pool, "a-held", "worker-a", time.Minute, time.Time{})
	expiredGrant := grant(t, d.pool, "b-expired", "worker-b", time.Second, time.Now().Add(-time.Hour))
	free := grant(t, d.pool, "c-free", "worker-c", time.Minute, time.Time{})
	if err := leases.Release(ctx, d.pool, free, nil); err != nil {
		t.Fatal(err)
	}
	opGrant := grant(t, d.pool, "d-operator", "worker-d", time.Minute, time.Time{})
	if _, err := leases.Expire(ctx, d.pool, "d-operator", "alice"); err != nil {
		t.Fatal(err)
	}

	all := d.listJSON(t)
	if got := names(all); !slices.Equal(got, []string{"a-held", "b-expired", "c-free", "d-operator"}) {
		t.Fatalf("list names %v", got)
	}
	held, expired, freed, op := all[0], all[1], all[2], all[3]
	if held.State != "held" || held.Holder == nil || *held.Holder != "worker-a" || held.FenceToken != heldGrant.Token ||
		held.TTLLeftMS <= 0 || held.TTLLeftMS > 60_000 || held.ExpiresAt == nil || held.ReleasedAt != nil || held.ExpiredBy != nil {
		t.Errorf("held lease listed as %+v", held)
	}
	if !parseTime(t, held.ExpiresAt).After(parseTime(t, held.DBNow)) || parseTime(t, held.AcquiredAt).IsZero() {
		t.Errorf("held lease times %+v", held)
	}
	if held.Metadata["host"] == "" || held.Metadata["pid"] != strconv.Itoa(os.Getpid()) || held.Metadata["app"] == "" {
		t.Errorf("held lease metadata %v, want host, pid and app", held.Metadata)
	}
	if expired.State != "expired" || expired.Holder == nil || *expired.Holder != "worker-b" || expired.TTLLeftMS != 0 ||
		!parseTime(t, expired.ExpiresAt).Before(parseTime(t, expired.DBNow)) {
		t.Errorf("expired grant listed as %+v", expired)
	}
	if freed.State != "free" || freed.Holder != nil || freed.ExpiresAt != nil || freed.ReleasedAt == nil || freed.TTLLeftMS != 0 || freed.ExpiredBy != nil {
		t.Errorf("released lease listed as %+v", freed)
	}
	if op.State != "free" || op.Holder != nil || op.ExpiredBy == nil || *op.ExpiredBy != "alice" || op.ForcedExpiries != 1 {
		t.Errorf("operator-expired lease listed as %+v", op)
	}

	if got := names(d.listJSON(t, "--held")); !slices.Equal(got, []string{"a-held"}) {
		t.Errorf("list --held = %v", got)
	}
	if got := names(d.listJSON(t, "--expired")); !slices.Equal(got, []string{"b-expired"}) {
		t.Errorf("list --expired = %v", got)
	}

	code, out, errOut := d.run(t, "leases", "list")
	if code != cli.ExitOK {
		t.Fatalf("leases list = %d, %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") != "NAME STATE HOLDER TOKEN TTL LEFT HOST PID APP ACQUIRED" {
		t.Fatalf("leases list printed:\n%s", out)
	}
	for i, want := range [][]string{
		{"a-held", "held", "worker-a", strconv.FormatInt(heldGrant.Token, 10)},
		{"b-expired", "expired", "worker-b", strconv.FormatInt(expiredGrant.Token, 10), "-"},
		{"c-free", "free", "-", strconv.FormatInt(free.Token, 10), "-"},
		{"d-operator", "free", "-", strconv.FormatInt(opGrant.Token, 10), "-"},
	} {
		if f := strings.Fields(lines[i+1]); len(f) != 9 || !slices.Equal(f[:len(want)], want) || f[6] != strconv.Itoa(os.Getpid()) {
			t.Errorf("row %q, want it to start with %v and show pid %d", lines[i+1], want, os.Getpid())
		}
	}
}

// An empty list is [] in JSON and a header alone as a table; --limit caps the list and says
// so on stderr; paging (a small hidden --page-size) reads everything in name order.
func TestLeasesListEmptyLimitAndPaging(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	code, out, _ := d.run(t, "--json", "leases", "list")
	if code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("list --json on no leases = %d, %q; want []", code, out)
	}
	code, out, _ = d.run(t, "leases", "list")
	if code != cli.ExitOK || !strings.HasPrefix(out, "NAME") || strings.Count(out, "\n") != 1 {
		t.Fatalf("list on no leases = %d, %q; want a header only", code, out)
	}

	var want []string
	for i := range 7 {
		n := "lease-" + strconv.Itoa(i)
		grant(t, d.pool, n, "w", time.Minute, time.Time{})
		want = append(want, n)
	}
	if got := names(d.listJSON(t, "--page-size", "2")); !slices.Equal(got, want) {
		t.Errorf("list --page-size 2 = %v, want %v", got, want)
	}
	code, out, errOut := d.run(t, "--json", "leases", "list", "--limit", "3", "--page-size", "2")
	var ls []listedLease
	if err := json.Unmarshal([]byte(out), &ls); code != cli.ExitOK || err != nil || !slices.Equal(names(ls), want[:3]) {
		t.Fatalf("list --limit 3 = %d, %q (%v)", code, out, err)
	}
	if !strings.Contains(errOut, "first 3 leases; there are more") {
		t.Errorf("list --limit 3 with 7 leases: stderr %q does not say there are more", errOut)
	}
	if _, _, errOut = d.run(t, "leases", "list", "--limit", "7"); errOut != "" {
		t.Errorf("list --limit 7 with 7 leases wrote %q to stderr", errOut)
	}
}

// Usage errors exit 2 before connecting: the URL points nowhere.
func TestLeasesUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"leases", "list", "--held", "--expired"},
		{"leases", "list", "--limit", "0"},
		{"leases", "list", "extra"},
		{"leases", "show"},
		{"leases", "show", ""},
		{"leases", "show", "a", "b"},
		{"leases", "expire"},
		{"leases", "expire", strings.Repeat("x", 300)},
		{"leases", "run", "--ttl", "1s", "--", "true"},
		{"leases", "run", "--name", "n", "--", "true"},
		{"leases", "run", "--name", "n", "--ttl", "1s"},
		{"leases", "run", "--name", "n", "--ttl", "1s", "--"},
		{"leases", "run", "--name", "n", "--ttl", "0s", "--", "true"},
		{"leases", "run", "--name", "n", "--ttl", "25h", "--", "true"},
		{"leases", "run", "--name", "n", "--ttl", "1s", "--grace", "-1s", "--", "true"},
		{"leases", "run", "--name", "n", "--ttl", "1s", "--wait", "-1s", "--", "true"},
		{"leases", "run", "--name", "n", "--ttl", "soon", "--", "true"},
		{"leases", "run", "--name", "", "--ttl", "1s", "--", "true"},
	} {
		code, out, errOut := run(t, append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, args...)...)
		if code != cli.ExitUsage || out != "" || !strings.HasPrefix(errOut, "pgcoord: ") {
			t.Errorf("pgcoord %q = %d, stdout %q, stderr %q; want exit 2 and a message", args, code, out, errOut)
		}
	}
}

func TestLeasesShow(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	l := grant(t, d.pool, "order:42", "worker-a", time.Minute, time.Time{})

	code, out, errOut := d.run(t, "leases", "show", "order:42")
	if code != cli.ExitOK {
		t.Fatalf("show = %d, %s", code, errOut)
	}
	for _, want := range []string{"name:", "order:42", "state:", "held", "holder:", "worker-a", "fence token:", strconv.FormatInt(l.Token, 10),
		"(by the database clock)", "metadata:", "pid=" + strconv.Itoa(os.Getpid())} {
		if !strings.Contains(out, want) {
			t.Errorf("show printed %q, missing %q", out, want)
		}
	}

	code, out, _ = d.run(t, "--json", "leases", "show", "order:42")
	var m map[string]any
	var s listedLease
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &m) != nil || json.Unmarshal([]byte(out), &s) != nil {
		t.Fatalf("show --json = %d, %q", code, out)
	}
	if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, leaseKeys) {
		t.Errorf("show --json keys %v, want %v", keys, leaseKeys)
	}
	if s.Name != "order:42" || s.State != "held" || s.FenceToken != l.Token || s.Holder == nil || *s.Holder != "worker-a" {
		t.Errorf("show --json = %+v", s)
	}

	code, out, errOut = d.run(t, "leases", "show", "no-such")
	if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, `no such lease "no-such"`) {
		t.Errorf("show of an unknown lease = %d, stdout %q, stderr %q; want exit 1 and 'no such lease'", code, out, errOut)
	}
}

// expire frees a held lease at once: the old holder's renewal fails with ErrLost and another
// holder gets it with a higher token. --dry-run changes nothing.
func TestLeasesExpire(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	ctx := context.Background()
	old := grant(t, d.pool, "job", "worker-a", time.Minute, time.Time{})

	code, out, errOut := d.run(t, "leases", "expire", "job", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "would expire") || !strings.Contains(out, "worker-a") ||
		!strings.Contains(out, "fence token "+strconv.FormatInt(old.Token, 10)) || !strings.Contains(out, "nothing changed") {
		t.Fatalf("expire --dry-run = %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = d.run(t, "--json", "leases", "expire", "job", "--dry-run", "--by", "bob")
	var dry struct {
		DryRun  bool        `json:"dry_run"`
		Expired bool        `json:"expired"`
		By      string      `json:"by"`
		Lease   listedLease `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &dry); code != cli.ExitOK || err != nil || !dry.DryRun || dry.Expired || dry.By != "bob" ||
		dry.Lease.State != "held" || dry.Lease.FenceToken != old.Token {
		t.Fatalf("expire --dry-run --json = %d, %q (%v)", code, out, err)
	}
	if i := getInfo(t, d.pool, "job"); !i.Held() || i.Holder != "worker-a" || i.Token != old.Token || i.ExpiredBy != "" {
		t.Fatalf("--dry-run changed the lease: %+v", i)
	}
	renewed, err := leases.Renew(ctx, d.pool, old, time.Minute, nil)
	if err != nil {
		t.Fatalf("the holder could not renew after a dry run: %v", err)
	}

	code, out, errOut = d.run(t, "--json", "leases", "expire", "job", "--by", "alice")
	var done struct {
		DryRun  bool        `json:"dry_run"`
		Expired bool        `json:"expired"`
		By      string      `json:"by"`
		Lease   listedLease `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &done); code != cli.ExitOK || err != nil || done.DryRun || !done.Expired || done.By != "alice" ||
		done.Lease.Holder == nil || *done.Lease.Holder != "worker-a" || done.Lease.FenceToken != old.Token {
		t.Fatalf("expire --json = %d, %q (%v), stderr %q", code, out, err, errOut)
	}
	if i := getInfo(t, d.pool, "job"); i.Held() || i.Holder != "" || i.ExpiredBy != "alice" {
		t.Fatalf("after expire the lease is %+v", i)
	}
	if _, err := leases.Renew(ctx, d.pool, renewed, time.Minute, nil); !errors.Is(err, leases.ErrLost) {
		t.Fatalf("the old holder's renewal after expire: %v, want ErrLost", err)
	}
	next, err := leases.TryAcquire(ctx, d.pool, "job", time.Minute, &leases.AcquireOpts{Holder: "worker-b"})
	if err != nil || next.Token <= old.Token {
		t.Fatalf("another holder after expire got %+v, %v; want the lease with a token above %d", next, err, old.Token)
	}

	// Human output, with the default --by.
	code, out, errOut = d.run(t, "leases", "expire", "job")
	if code != cli.ExitOK || !strings.Contains(out, "expired lease \"job\"") || !strings.Contains(out, "worker-b") ||
		!strings.Contains(out, "fence token above "+strconv.FormatInt(next.Token, 10)) {
		t.Fatalf("expire = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if i := getInfo(t, d.pool, "job"); !strings.HasSuffix(i.ExpiredBy, " via pgcoord-cli") || !strings.Contains(i.ExpiredBy, "@") {
		t.Errorf("default --by recorded %q, want \"$USER@host via pgcoord-cli\"", i.ExpiredBy)
	}
}

// A lease that is not held, or was never granted, cannot be expired: exit 1 with a clear
// message, with or without --dry-run.
func TestLeasesExpireNotHeld(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	l := grant(t, d.pool, "done", "worker-a", time.Minute, time.Time{})
	if err := leases.Release(context.Background(), d.pool, l, nil); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"done"}, {"done", "--dry-run"}} {
		code, out, errOut := d.run(t, append([]string{"leases", "expire"}, args...)...)
		if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, `lease "done" is not held`) {
			t.Errorf("expire %v of a released lease = %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"never"}, {"never", "--dry-run"}} {
		code, out, errOut := d.run(t, append([]string{"leases", "expire"}, args...)...)
		if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, `no such lease "never"`) {
			t.Errorf("expire %v of an unknown lease = %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if i := getInfo(t, d.pool, "done"); i.ExpiredBy != "" || i.Token != l.Token {
		t.Errorf("a failed expire changed the lease: %+v", i)
	}

	// A grant that expired by time but was not taken since still has a holder: expiring it
	// works, and says the grant had already expired.
	grant(t, d.pool, "stale", "worker-z", time.Second, time.Now().Add(-time.Hour))
	code, out, errOut := d.run(t, "leases", "expire", "stale", "--by", "carol")
	if code != cli.ExitOK || !strings.Contains(out, "worker-z") || !strings.Contains(out, "had already expired") {
		t.Errorf("expire of an expired grant = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if i := getInfo(t, d.pool, "stale"); i.Holder != "" || i.ExpiredBy != "carol" {
		t.Errorf("after expiring an expired grant the lease is %+v", i)
	}
}

// leases run hands the child the granted token, name and holder, exits with the child's
// code, and releases the lease afterwards.
func TestLeasesRunPassesTokenAndExitCode(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	// Earlier grants: each run's token is higher than every one before.
	var last int64
	for range 3 {
		l := grant(t, d.pool, "job", "someone", time.Minute, time.Time{})
		if err := leases.Release(context.Background(), d.pool, l, nil); err != nil {
			t.Fatal(err)
		}
		last = l.Token
	}
	script := `echo "$PGCOORD_LEASE_NAME $PGCOORD_LEASE_HOLDER $PGCOORD_FENCE_TOKEN"; exit "$1"`
	for _, exit := range []int{0, 7} {
		code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--holder", "runner",
			"--", "sh", "-c", script, "sh", strconv.Itoa(exit))
		f := strings.Fields(out)
		var token int64
		if len(f) == 3 {
			token, _ = strconv.ParseInt(f[2], 10, 64)
		}
		if code != exit || len(f) != 3 || f[0] != "job" || f[1] != "runner" || token <= last {
			t.Errorf("run exiting %d: pgcoord exit %d, stdout %q, stderr %q; want exit %d and \"job runner <a token above %d>\"",
				exit, code, out, errOut, exit, last)
		}
		if errOut != "" {
			t.Errorf("run exiting %d wrote %q to stderr", exit, errOut)
		}
		if info := getInfo(t, d.pool, "job"); info.Holder != "" || info.Token != token || info.Metadata["command"] != "sh" {
			t.Errorf("after the run the lease is %+v; want it released, token %d, command sh", info, token)
		}
		last = token
	}

	// Without --holder each run gets a new identity; the flags before the command are
	// pgcoord's, everything after it the command's (no -- needed).
	code, out, _ := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "sh", "-c", `echo "$PGCOORD_LEASE_HOLDER" "$0"`, "--json")
	if f := strings.Fields(out); code != 0 || len(f) != 2 || f[0] == "runner" || !strings.Contains(f[0], "/") || f[1] != "--json" {
		t.Errorf("run without --holder = %d, %q; want a host/pid/random holder and --json passed to the command", code, out)
	}
}

// A child killed by a signal gives 128+signal, as in shells; a command that cannot be found
// gives 127 without touching the lease.
func TestLeasesRunSignalAndNotFoundCodes(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	code, _, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", "kill -KILL $$")
	if code != 128+int(syscall.SIGKILL) {
		t.Errorf("child killed by SIGKILL: exit %d, want %d (stderr %q)", code, 128+int(syscall.SIGKILL), errOut)
	}
	code, out, errOut := d.run(t, "leases", "run", "--name", "other", "--ttl", "10s", "--", "pgcoord-no-such-command-x")
	if code != 127 || out != "" || !strings.Contains(errOut, "command not found") {
		t.Errorf("run of a missing command = %d, stdout %q, stderr %q; want 127", code, out, errOut)
	}
	if _, err := leases.Get(context.Background(), d.pool, "other"); !errors.Is(err, leases.ErrNotFound) {
		t.Errorf("a run whose command was not found touched the lease: %v", err)
	}
}

// leases run waits for a held lease and is woken when it is released.
func TestLeasesRunWaitsForRelease(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	ctx := context.Background()
	held := grant(t, d.pool, "job", "other", time.Minute, time.Time{})
	res := d.start(ctx, "leases", "run", "--name", "job", "--ttl", "10s", "--", "sh", "-c", `echo "$PGCOORD_FENCE_TOKEN"`)
	waitFor(t, 10*time.Second, "pgcoord to register as a waiter", func() bool {
		var waiting bool
		err := d.pool.QueryRow(ctx, "SELECT coalesce(wanted_until > now(), false) FROM pgcoord_leases WHERE name = 'job'").Scan(&waiting)
		return err == nil && waiting
	})
	select {
	case r := <-res:
		t.Fatalf("pgcoord ran while the lease was held: %+v", r)
	default:
	}
	if err := leases.Release(ctx, d.pool, held, nil); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, 10*time.Second)
	if token, _ := strconv.ParseInt(strings.TrimSpace(r.out), 10, 64); r.code != 0 || token <= held.Token {
		t.Fatalf("run after the release = %d, stdout %q, stderr %q; want a token above %d", r.code, r.out, r.errOut, held.Token)
	}
}

// --wait D gives up after D, and --wait 0 after one attempt, with exit 1 and without running
// the command; on a free lease --wait 0 runs it with a single grant.
func TestLeasesRunWaitGivesUp(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	held := grant(t, d.pool, "job", "other", time.Minute, time.Time{})
	for _, wait := range []string{"300ms", "0"} {
		t0 := time.Now()
		code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--wait", wait, "--", "touch", marker)
		if code != cli.ExitFailure || out != "" || !strings.Contains(errOut, `gave up waiting for lease "job"`) || !strings.Contains(errOut, "held by other") {
			t.Errorf("run --wait %s on a held lease = %d, stdout %q, stderr %q", wait, code, out, errOut)
		}
		if wait == "300ms" && time.Since(t0) < 300*time.Millisecond {
			t.Errorf("run --wait 300ms gave up after %v", time.Since(t0))
		}
		if fileExists(marker)() {
			t.Fatalf("run --wait %s ran the command although the lease was held", wait)
		}
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "other" || i.Token != held.Token {
		t.Fatalf("giving up changed the lease: %+v", i)
	}

	if err := leases.Release(context.Background(), d.pool, held, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := d.run(t, "leases", "run", "--name", "job", "--ttl", "10s", "--wait", "0", "--", "sh", "-c", `echo "$PGCOORD_FENCE_TOKEN"`)
	token, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if code != 0 || token <= held.Token {
		t.Fatalf("run --wait 0 on a free lease = %d, stdout %q, stderr %q; want a token above %d", code, out, errOut, held.Token)
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "" || i.Token != token {
		t.Fatalf("after run --wait 0 the lease is %+v; want it released after the grant with token %d", i, token)
	}
}

// startSleeper starts `leases run` with a child that runs traps (its signal handlers),
// records its token, signals readiness, then runs script (which must not return soon). It
// returns the background result and the token the child saw.
func startSleeper(t *testing.T, ctx context.Context, d leaseDB, dir, traps, script string, flags ...string) (<-chan result, string) {
	t.Helper()
	args := append([]string{"leases", "run", "--name", "job", "--ttl", "1s"}, flags...)
	args = append(args, "--", "sh", "-c", traps+`
		echo "$PGCOORD_FENCE_TOKEN" > "$1/token"; touch "$1/ready"
		`+script, "sh", dir)
	res := d.start(ctx, args...)
	waitFor(t, 10*time.Second, "the child to start", fileExists(filepath.Join(dir, "ready")))
	return res, readFile(t, filepath.Join(dir, "token"))
}

// When an operator expires the lease while the command runs, the command is stopped
// (SIGTERM to its process group) and pgcoord exits non-zero promptly, saying why.
func TestLeasesRunStopsChildWhenLeaseLost(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	dir := t.TempDir()
	res, token := startSleeper(t, context.Background(), d, dir, "", "exec sleep 60")
	info := getInfo(t, d.pool, "job")
	if !info.Held() || strconv.FormatInt(info.Token, 10) != token {
		t.Fatalf("while the child runs the lease is %+v; the child saw token %s", info, token)
	}
	if _, err := leases.Expire(context.Background(), d.pool, "job", "test operator"); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, 15*time.Second)
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d after the lease was lost, want %d (the child's SIGTERM); stderr %q", r.code, 128+int(syscall.SIGTERM), r.errOut)
	}
	if !strings.Contains(r.errOut, `lost lease "job" (fence token `+token+")") || !strings.Contains(r.errOut, "stopping the command (SIGTERM") {
		t.Errorf("stderr %q does not say the lease was lost and the command stopped", r.errOut)
	}
	// A new holder gets it with a higher token.
	l := grant(t, d.pool, "job", "next", time.Minute, time.Time{})
	if strconv.FormatInt(l.Token-1, 10) != token {
		t.Errorf("the next grant has token %d, want %s+1", l.Token, token)
	}
}

// A child that ignores SIGTERM is killed after --grace; a shell's own children in the
// process group are stopped too.
func TestLeasesRunKillsAfterGrace(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	dir := t.TempDir()
	// The shell ignores SIGTERM; its background sleep records its pid so the test can check
	// that it was stopped with the group.
	res, _ := startSleeper(t, context.Background(), d, dir, `trap "" TERM`,
		`sleep 60 & echo $! > "$1/bg.tmp"; mv "$1/bg.tmp" "$1/bg"; wait`, "--grace", "300ms")
	waitFor(t, 10*time.Second, "the background child to start", fileExists(filepath.Join(dir, "bg")))
	bg, err := strconv.Atoi(readFile(t, filepath.Join(dir, "bg")))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := leases.Expire(context.Background(), d.pool, "job", "test operator"); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, 15*time.Second)
	if r.code != 128+int(syscall.SIGKILL) || !strings.Contains(r.errOut, "SIGKILL after 300ms") {
		t.Errorf("exit %d, stderr %q; want %d (SIGKILL after the grace period)", r.code, r.errOut, 128+int(syscall.SIGKILL))
	}
	if e := time.Since(t0); e < 300*time.Millisecond {
		t.Errorf("the child was killed %v after the expiry, before the 300ms grace period", e)
	}
	waitFor(t, 5*time.Second, "the shell's background child to be gone", func() bool { return processGone(bg) })
}

// processGone reports whether pid no longer runs: gone, or a zombie nobody reaped yet.
func processGone(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	// The state follows the parenthesized command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// Cancelling pgcoord's context (as main does on a signal it cannot name) stops the child with
// SIGTERM; a child that then exits 0 still makes pgcoord exit 1; the lease is released.
func TestLeasesRunInterruptedStopsChild(t *testing.T) {
	t.Parallel()
	d := newLeaseDB(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, _ := startSleeper(t, ctx, d, dir, `trap 'echo TERM > "$1/got"; exit 0' TERM`, `while :; do sleep 0.05; done`, "--ttl", "10s")
	cancel()
	r := await(t, res, 15*time.Second)
	if r.code != cli.ExitFailure || !strings.Contains(r.errOut, "interrupted") {
		t.Errorf("interrupted run = %d, stderr %q; want exit 1 and a message", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "TERM" {
		t.Errorf("the child got %q, want TERM", got)
	}
	if i := getInfo(t, d.pool, "job"); i.Holder != "" || i.ExpiredBy != "" {
		t.Errorf("after an interrupted run the lease is %+v; want it released", i)
	}
}

// A real SIGINT to the process, turned into a cancelled context by signal.NotifyContext as
// cmd/pgcoord's main does, reaches the child as SIGINT, once.
func TestLeasesRunForwardsSignal(t *testing.T) {
	// Not parallel: it sends SIGINT to the test process.
	d := newLeaseDB(t)
	dir := t.TempDir()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, _ := startSleeper(t, ctx, d, dir,
		`trap 'echo INT >> "$1/got"' INT; trap 'echo TERM >> "$1/got"; exit 0' TERM`, `while :; do sleep 0.05; done`,
		"--ttl", "10s", "--grace", "500ms")
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, 15*time.Second)
	// The child keeps running after its INT trap, so it is killed after the grace period.
	if r.code != 128+int(syscall.SIGKILL) || !strings.Contains(r.errOut, "interrupt signal received") || !strings.Contains(r.errOut, "SIGINT") {
		t.Errorf("run after SIGINT = %d, stderr %q", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "INT" {
		t.Errorf("the child received %q, want INT exactly once", got)
	}
}

// A SIGHUP to pgcoord (a terminal hangup), which main does not catch, is forwarded to the
// command as SIGHUP too, instead of killing pgcoord and leaving the command unrenewed.
func TestLeasesRunForwardsHangup(t *testing.T) {
	// Not parallel: it sends SIGHUP to the test process.
	if signal.Ignored(syscall.SIGHUP) {
		t.Skip("SIGHUP is ignored in this process (nohup): leases run leaves it alone")
	}
	d := newLeaseDB(t)
	dir := t.TempDir()
	res, _ := startSleeper(t, context.Background(), d, dir, `trap 'echo HUP > "$1/got"; exit 0' HUP`, `while :; do sleep 0.05; done`, "--ttl", "10s")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, 15*time.Second)
	if r.code != cli.ExitFailure || !strings.Contains(r.errOut, "hangup signal received") || !strings.Contains(r.errOut, "(SIGHUP, SIGKILL after 5s)") {
		t.Errorf("run after SIGHUP = %d, stderr %q; want exit 1 and a message", r.code, r.errOut)
	}
	if got := readFile(t, filepath.Join(dir, "got")); got != "HUP" {
		t.Errorf("the child received %q, want HUP", got)
	}
}
