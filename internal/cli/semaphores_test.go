package cli_test

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/semaphore"
)

// semGrant takes a permit of key (limit) for holder through the API; with a non-zero now the
// grant is made as of then, by the schema's clock (pgtest.Clock), so a past now and a short
// ttl make a permit that has expired.
func semGrant(t *testing.T, pool *pgxpool.Pool, key, holder string, limit int, ttl time.Duration, now time.Time) semaphore.Permit {
	t.Helper()
	if !now.IsZero() {
		clock := pgtest.NewClock(t, pool)
		clock.Freeze(now)
		defer clock.Run(0)
	}
	p, err := semaphore.TryAcquire(t.Context(), pool, key, limit, ttl, &semaphore.AcquireOpts{Holder: holder})
	if err != nil {
		t.Fatalf("acquire %s for %s: %v", key, holder, err)
	}
	return p
}

func semGet(t *testing.T, pool *pgxpool.Pool, key string) semaphore.KeyStatus {
	t.Helper()
	s, err := semaphore.Get(t.Context(), pool, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return s
}

// listedSemaphore is one element of `semaphores list --json`.
type listedSemaphore struct {
	Key               string  `json:"key"`
	Limit             int     `json:"limit"`
	Weight            int     `json:"weight"`
	FenceToken        int64   `json:"fence_token"`
	Held              int     `json:"held"`
	Expired           int     `json:"expired"`
	Waiters           int     `json:"waiters"`
	OldestWaiterSince *string `json:"oldest_waiter_since"`
	OldestWaiterAgeMS *int64  `json:"oldest_waiter_age_ms"`
	OldestPermitAt    *string `json:"oldest_permit_at"`
	OldestPermitAgeMS *int64  `json:"oldest_permit_age_ms"`
	Demand            int64   `json:"demand"`
	VTime             float64 `json:"vtime"`
	Admitted          int64   `json:"admitted"`
	Refused           int64   `json:"refused"`
	OverLimit         bool    `json:"over_limit"`
	DBNow             *string `json:"db_now"`
}

var semKeys = []string{"admitted", "db_now", "demand", "expired", "fence_token", "held", "key", "limit",
	"oldest_permit_age_ms", "oldest_permit_at", "oldest_waiter_age_ms", "oldest_waiter_since", "over_limit",
	"refused", "vtime", "wait_p50_ms", "wait_p99_ms", "waited", "waiters", "weight"}

var semPermitKeys = []string{"acquired_at", "age_ms", "expired", "expires_at", "fence_token", "holder",
	"renewed_at", "reserved", "ttl_left_ms"}

// checkKeys fails the test unless m has exactly the keys want.
func semCheckKeys(t *testing.T, what string, m map[string]any, want []string) {
	t.Helper()
	if keys := slices.Sorted(maps.Keys(m)); !slices.Equal(keys, want) {
		t.Fatalf("%s has keys %v, want %v", what, keys, want)
	}
}

// semListJSON runs `semaphores list --json` and decodes it, checking the keys of every object.
func (d testDB) semListJSON(t *testing.T) []listedSemaphore {
	t.Helper()
	code, out, errOut := d.run(t, "--json", "semaphores", "list")
	if code != cli.ExitOK {
		t.Fatalf("semaphores list --json = %d, stderr %q", code, errOut)
	}
	var raw []map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil || raw == nil {
		t.Fatalf("semaphores list --json printed %q, not a JSON array: %v", out, err)
	}
	for _, m := range raw {
		semCheckKeys(t, "semaphore object", m, semKeys)
	}
	var ls []listedSemaphore
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatal(err)
	}
	return ls
}

// A key with two held permits, one expired, a waiter and demand; a key over its lowered
// limit; a quiet key: list shows each as it is, in table and JSON.
func TestSemaphoresList(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := t.Context()
	if ls := d.semListJSON(t); len(ls) != 0 {
		t.Fatalf("list of an empty schema = %v, want []", ls)
	}
	code, out, _ := d.run(t, "semaphores", "list")
	if code != cli.ExitOK || !strings.HasPrefix(out, "KEY") || strings.Count(out, "\n") != 1 {
		t.Fatalf("semaphores list on no keys = %d, %q; want the header only", code, out)
	}

	semGrant(t, d.pool, "a-busy", "w1", 3, time.Minute, time.Time{})
	semGrant(t, d.pool, "a-busy", "w2", 3, time.Minute, time.Time{})
	// An hour ago by the database clock: a permit that expired a second later, and a waiter
	// still waiting (a refused acquire that asks to wait is put in line; the key was full
	// then, the dead holder alive).
	clock := pgtest.NewClock(t, d.pool)
	clock.Freeze(clock.Now().Add(-time.Hour))
	if _, err := semaphore.TryAcquire(ctx, d.pool, "a-busy", 3, time.Second, &semaphore.AcquireOpts{Holder: "dead"}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pgcoord_semaphore_acquire('a-busy', 'waiting', 3,
		interval '1 minute', interval '2 hours')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("acquire of a full key: %d rows, %v", n, err)
	}
	clock.Run(0)
	if err := semaphore.Release(ctx, d.pool, semGrant(t, d.pool, "b-over", "x", 3, time.Minute, time.Time{})); err != nil {
		t.Fatal(err)
	}
	var lastOver semaphore.Permit
	for _, h := range []string{"o1", "o2", "o3"} {
		lastOver = semGrant(t, d.pool, "b-over", h, 3, time.Minute, time.Time{})
	}
	if err := semaphore.SetLimit(ctx, d.pool, "b-over", 1, &semaphore.SetLimitOpts{Weight: 5}); err != nil {
		t.Fatal(err)
	}
	if err := semaphore.AddDemand(ctx, d.pool, "c-quiet", 7, &semaphore.AddDemandOpts{Limit: 2}); err != nil {
		t.Fatal(err)
	}

	ls := d.semListJSON(t)
	if got := []string{ls[0].Key, ls[1].Key, ls[2].Key}; len(ls) != 3 || !slices.Equal(got, []string{"a-busy", "b-over", "c-quiet"}) {
		t.Fatalf("listed %v, want a-busy, b-over, c-quiet", ls)
	}
	busy, over, quiet := ls[0], ls[1], ls[2]
	if busy.Limit != 3 || busy.Held != 2 || busy.Expired != 1 || busy.Waiters != 1 || busy.OverLimit || busy.Refused != 1 {
		t.Errorf("a-busy = %+v; want limit 3, held 2, expired 1, waiters 1, refused 1, not over", busy)
	}
	// The oldest permit is the oldest live one: w1, granted just now (the dead one is older).
	if busy.OldestWaiterAgeMS == nil || busy.OldestWaiterSince == nil || *busy.OldestWaiterAgeMS < (59*time.Minute).Milliseconds() ||
		busy.OldestPermitAgeMS == nil || *busy.OldestPermitAgeMS > (10*time.Minute).Milliseconds() {
		t.Errorf("a-busy: oldest waiter %v, oldest permit age %v ms; want the hour-old waiter and a live permit of the last minutes",
			busy.OldestWaiterSince, busy.OldestPermitAgeMS)
	}
	parseTime(t, busy.DBNow)
	if over.Limit != 1 || over.Weight != 5 || over.Held != 3 || !over.OverLimit || over.Admitted != 4 || over.FenceToken != lastOver.Token {
		t.Errorf("b-over = %+v; want limit 1, weight 5, held 3, over limit, 4 admitted, token %d (the last permit's)", over, lastOver.Token)
	}
	if quiet.Demand != 7 || quiet.Limit != 2 || quiet.Held != 0 || quiet.OldestPermitAt != nil || quiet.OldestPermitAgeMS != nil ||
		quiet.OldestWaiterSince != nil || quiet.OldestWaiterAgeMS != nil {
		t.Errorf("c-quiet = %+v; want demand 7, limit 2, nothing held, null times", quiet)
	}

	code, out, errOut := d.run(t, "semaphores", "list")
	if code != cli.ExitOK {
		t.Fatalf("semaphores list = %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "OLDEST WAITER") || !strings.Contains(lines[0], "DEMAND") {
		t.Fatalf("semaphores list printed:\n%s", out)
	}
	for i, want := range [][]string{
		{"a-busy", "3", "2", "1", "1h0m", "leaked"},
		{"b-over", "1", "5", "3", "over_limit"},
		{"c-quiet", "2", "1", "0", "7", "ok"},
	} {
		f := strings.Fields(lines[i+1])
		for _, w := range want {
			if !slices.Contains(f, w) {
				t.Errorf("row %q lacks %q", lines[i+1], w)
			}
		}
	}

	// --limit stops early and says so.
	code, out, errOut = d.run(t, "semaphores", "list", "--limit", "2")
	if code != cli.ExitOK || strings.Count(out, "\n") != 3 || !strings.Contains(errOut, "there are more") {
		t.Errorf("list --limit 2 = %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestSemaphoresShow(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	live := semGrant(t, d.pool, "tenant:1", "live-holder", 2, time.Minute, time.Time{})
	dead := semGrant(t, d.pool, "tenant:1", "dead-holder", 2, 30*time.Second, time.Now().Add(-time.Hour)) // expired 59m30s ago

	code, out, errOut := d.run(t, "semaphores", "show", "tenant:1")
	if code != cli.ExitOK {
		t.Fatalf("show = %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"key:", "tenant:1", "limit:", "held:", "expired:", "leaked", "HOLDER", "TTL LEFT",
		"live-holder", "dead-holder", "expired 59m"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = d.run(t, "--json", "semaphores", "show", "tenant:1")
	if code != cli.ExitOK {
		t.Fatalf("show --json = %d, stderr %q", code, errOut)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	semCheckKeys(t, "show object", raw, slices.Sorted(slices.Values(append(slices.Clone(semKeys), "permits"))))
	var shown struct {
		Key     string `json:"key"`
		Held    int    `json:"held"`
		Expired int    `json:"expired"`
		Permits []struct {
			Holder     string  `json:"holder"`
			FenceToken int64   `json:"fence_token"`
			RenewedAt  *string `json:"renewed_at"`
			Reserved   bool    `json:"reserved"`
			AgeMS      int64   `json:"age_ms"`
			TTLLeftMS  int64   `json:"ttl_left_ms"`
			Expired    bool    `json:"expired"`
		} `json:"permits"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatal(err)
	}
	for _, p := range raw["permits"].([]any) {
		semCheckKeys(t, "permit object", p.(map[string]any), semPermitKeys)
	}
	if shown.Held != 1 || shown.Expired != 1 || len(shown.Permits) != 2 {
		t.Fatalf("show --json = %s", out)
	}
	for _, p := range shown.Permits {
		switch p.Holder {
		case "live-holder":
			if p.Expired || p.TTLLeftMS <= 0 || p.TTLLeftMS > time.Minute.Milliseconds() || p.RenewedAt != nil || p.FenceToken != live.Token || p.Reserved {
				t.Errorf("live permit %+v", p)
			}
		case "dead-holder":
			if !p.Expired || p.TTLLeftMS != 0 || p.AgeMS < (59*time.Minute).Milliseconds() || p.FenceToken != dead.Token {
				t.Errorf("expired permit %+v", p)
			}
		default:
			t.Errorf("unexpected permit %+v", p)
		}
	}

	// A permit of Next reserves a unit of its key's demand: show says so.
	if err := semaphore.AddDemand(t.Context(), d.pool, "tenant:fair", 3, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := semaphore.Next(t.Context(), d.pool, time.Minute, &semaphore.NextOpts{Holder: "fair-worker"}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = d.run(t, "--json", "semaphores", "show", "tenant:fair")
	if code != cli.ExitOK || !strings.Contains(out, `"reserved": true`) || !strings.Contains(out, `"demand": 3`) {
		t.Errorf("show --json of a key with a permit of Next = %d, %s", code, out)
	}
	code, out, _ = d.run(t, "semaphores", "show", "tenant:fair")
	if code != cli.ExitOK || !strings.Contains(out, "RESERVED") || !regexp.MustCompile(`fair-worker\s+\d+\s+yes`).MatchString(out) {
		t.Errorf("show of a key with a permit of Next = %d, %s", code, out)
	}

	// A key without permits: [] and a note.
	if err := semaphore.SetLimit(t.Context(), d.pool, "tenant:empty", 3, nil); err != nil {
		t.Fatal(err)
	}
	code, out, _ = d.run(t, "--json", "semaphores", "show", "tenant:empty")
	if code != cli.ExitOK || !strings.Contains(out, `"permits": []`) || !strings.Contains(out, `"oldest_permit_at": null`) {
		t.Errorf("show --json of a key without permits = %d, %s", code, out)
	}
	code, out, _ = d.run(t, "semaphores", "show", "tenant:empty")
	if code != cli.ExitOK || !strings.Contains(out, "no permits held") {
		t.Errorf("show of a key without permits = %d, %s", code, out)
	}

	code, _, errOut = d.run(t, "semaphores", "show", "nobody")
	if code != cli.ExitFailure || !strings.Contains(errOut, `no such semaphore "nobody"`) {
		t.Errorf("show of an unknown key = %d, stderr %q; want 1, no such semaphore", code, errOut)
	}
}

func TestSemaphoresUsageErrors(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	long := strings.Repeat("k", 256)
	for _, args := range [][]string{
		{"semaphores", "nope"},
		{"semaphores", "list", "extra"},
		{"semaphores", "list", "--limit", "0"},
		{"semaphores", "show"},
		{"semaphores", "show", ""},
		{"semaphores", "show", long},
		{"semaphores", "set-limit", "k"},
		{"semaphores", "set-limit", "k", "0"},
		{"semaphores", "set-limit", "k", "-3"},
		{"semaphores", "set-limit", "k", "four"},
		{"semaphores", "set-limit", "k", "4", "--weight", "0"},
		{"semaphores", "set-limit", "k", "4", "--weight", "-1"},
		{"semaphores", "set-limit", "k", "4", "--weight", "1000001"},
		{"semaphores", "set-limit", "", "4"},
		{"semaphores", "verify", "extra"},
		{"semaphores", "drain"},
		{"semaphores", "drain", "a", "b"},
		{"semaphores", "drain", "\x00"},
		{"semaphores", "drain", "k", "--dry-run=maybe"},
	} {
		code, _, errOut := d.run(t, args...)
		if code != cli.ExitUsage {
			t.Errorf("%q = %d, stderr %q; want %d", args, code, errOut, cli.ExitUsage)
		}
	}
	if ls := d.semListJSON(t); len(ls) != 0 {
		t.Errorf("usage errors created keys: %v", ls)
	}
	// The group command alone prints its help.
	code, out, _ := d.run(t, "semaphores")
	if code != cli.ExitOK || !strings.Contains(out, "verify") || !strings.Contains(out, "drain") {
		t.Errorf("semaphores = %d, %q; want its help", code, out)
	}
}
