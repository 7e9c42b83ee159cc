package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
)

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
func (d testDB) listJSON(t *testing.T, args ...string) []listedLease {
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

// list shows held, expired and free leases as such, by the database clock, with --held and
// --expired selecting, in table and JSON form.
func TestLeasesListStates(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
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
	d := newTestDB(t)
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
	d := newTestDB(t)
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
	d := newTestDB(t)
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
	d := newTestDB(t)
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
