package cli_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/semaphore"
)

func TestSemaphoresSetLimit(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	code, out, errOut := d.run(t, "semaphores", "set-limit", "tenant:new", "4", "--weight", "3")
	if code != cli.ExitOK || !strings.Contains(out, "limit 4, weight 3") {
		t.Fatalf("set-limit = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if s := semGet(t, d.pool, "tenant:new"); s.Limit != 4 || s.Weight != 3 {
		t.Fatalf("after set-limit: %+v", s)
	}
	// Without --weight the weight stays.
	if code, _, errOut = d.run(t, "semaphores", "set-limit", "tenant:new", "6"); code != cli.ExitOK {
		t.Fatalf("set-limit = %d, stderr %q", code, errOut)
	}
	if s := semGet(t, d.pool, "tenant:new"); s.Limit != 6 || s.Weight != 3 {
		t.Fatalf("after set-limit without --weight: %+v, want limit 6, weight 3", s)
	}

	// Lowering below what is held revokes nothing and says so.
	semGrant(t, d.pool, "tenant:held", "a", 3, time.Minute, time.Time{})
	semGrant(t, d.pool, "tenant:held", "b", 3, time.Minute, time.Time{})
	code, out, _ = d.run(t, "semaphores", "set-limit", "tenant:held", "1")
	if code != cli.ExitOK || !strings.Contains(out, "more than the new limit") {
		t.Errorf("set-limit below held = %d, %q", code, out)
	}
	if s := semGet(t, d.pool, "tenant:held"); s.Limit != 1 || s.Held != 2 {
		t.Errorf("after lowering: %+v, want limit 1 with 2 still held", s)
	}

	code, out, _ = d.run(t, "--json", "semaphores", "set-limit", "tenant:new", "2")
	var raw map[string]any
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &raw) != nil {
		t.Fatalf("set-limit --json = %d, %q", code, out)
	}
	semCheckKeys(t, "set-limit object", raw, semKeys)
	if raw["limit"] != 2.0 || raw["weight"] != 3.0 {
		t.Errorf("set-limit --json = %v", raw)
	}
}

// drain revokes every permit of a key for real: the holders' renewals fail afterwards, and
// --dry-run changes nothing.
func TestSemaphoresDrain(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := t.Context()
	p1 := semGrant(t, d.pool, "tenant:9", "worker-1", 3, time.Minute, time.Time{})
	p2 := semGrant(t, d.pool, "tenant:9", "worker-2", 3, time.Minute, time.Time{})
	other := semGrant(t, d.pool, "tenant:10", "worker-3", 3, time.Minute, time.Time{})

	code, out, errOut := d.run(t, "semaphores", "drain", "tenant:9", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, `would revoke 2 permit(s) of semaphore "tenant:9"`) ||
		!strings.Contains(out, "worker-1") || !strings.Contains(out, "worker-2") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("drain --dry-run = %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = d.run(t, "--json", "semaphores", "drain", "tenant:9", "--dry-run")
	var raw map[string]any
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &raw) != nil {
		t.Fatalf("drain --dry-run --json = %d, %q", code, out)
	}
	semCheckKeys(t, "drain object", raw, []string{"dry_run", "key", "permits", "revoked", "would_revoke"})
	if raw["dry_run"] != true || raw["revoked"] != nil || raw["would_revoke"] != 2.0 || len(raw["permits"].([]any)) != 2 {
		t.Errorf("drain --dry-run --json = %s", out)
	}
	if s := semGet(t, d.pool, "tenant:9"); s.Held != 2 {
		t.Fatalf("after drain --dry-run: %d held, want 2", s.Held)
	}
	if _, err := semaphore.Renew(ctx, d.pool, p1, time.Minute, nil); err != nil {
		t.Fatalf("renew after a dry run: %v", err)
	}

	code, out, errOut = d.run(t, "semaphores", "drain", "tenant:9")
	if code != cli.ExitOK || !strings.Contains(out, `revoked 2 permit(s) of semaphore "tenant:9"`) ||
		!strings.Contains(out, "renewals and releases now fail") || !strings.Contains(out, fmt.Sprintf("up to %d", max(p1.Token, p2.Token))) {
		t.Fatalf("drain = %d, stdout %q, stderr %q", code, out, errOut)
	}
	if s := semGet(t, d.pool, "tenant:9"); s.Held != 0 || s.Expired != 0 {
		t.Errorf("after drain: %+v, want nothing held", s)
	}
	for _, p := range []semaphore.Permit{p1, p2} {
		if _, err := semaphore.Renew(ctx, d.pool, p, time.Minute, nil); !errors.Is(err, semaphore.ErrLost) {
			t.Errorf("renew of drained permit %s/%d = %v, want ErrLost", p.Holder, p.Token, err)
		}
	}
	if _, err := semaphore.Renew(ctx, d.pool, other, time.Minute, nil); err != nil {
		t.Errorf("renew of another key's permit after drain: %v", err)
	}
	// The next admission's token is above the drained ones.
	if next := semGrant(t, d.pool, "tenant:9", "worker-1", 3, time.Minute, time.Time{}); next.Token <= p2.Token {
		t.Errorf("token after drain %d, want above %d", next.Token, p2.Token)
	}

	// Draining again revokes the new permit; a key without permits revokes nothing.
	code, out, _ = d.run(t, "--json", "semaphores", "drain", "tenant:9")
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &raw) != nil || raw["revoked"] != 1.0 || raw["would_revoke"] != nil {
		t.Errorf("drain --json = %d, %s", code, out)
	}
	code, out, _ = d.run(t, "semaphores", "drain", "tenant:9")
	if code != cli.ExitOK || !strings.Contains(out, "held no permits") {
		t.Errorf("drain of an empty key = %d, %q", code, out)
	}
	code, _, errOut = d.run(t, "semaphores", "drain", "nobody")
	if code != cli.ExitFailure || !strings.Contains(errOut, "no such semaphore") {
		t.Errorf("drain of an unknown key = %d, %q", code, errOut)
	}
}
