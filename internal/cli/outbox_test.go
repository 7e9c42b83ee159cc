package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/outbox"
)

// obEnqueue commits msgs through the API and returns their ids.
func obEnqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		got, err := outbox.EnqueueBatch(t.Context(), tx, msgs)
		for _, m := range got {
			ids = append(ids, m.ID)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// obKill makes message "poison" of topic audit dead: one failed attempt with MaxAttempts 1.
func obKill(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	r, err := outbox.NewRelay(pool, &outbox.Config{Topics: []string{"audit"}, MaxAttempts: 1,
		Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error { return fmt.Errorf("downstream said no") })})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunBatch(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func obMsg(topic, key, payload string) outbox.Message {
	return outbox.Message{Topic: topic, Key: key, Payload: []byte(payload), JSON: true}
}

func TestOutboxStatsListRetry(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ids := obEnqueue(t, d.pool, obMsg("orders", "o-1", `{"n":1}`), obMsg("orders", "o-2", `{"n":2}`), obMsg("audit", "a", `"poison"`))
	obKill(t, d.pool)

	code, out, errOut := d.run(t, "--json", "outbox", "stats")
	if code != cli.ExitOK {
		t.Fatalf("outbox stats --json = %d, %s", code, errOut)
	}
	var stats []map[string]any
	if err := json.Unmarshal([]byte(out), &stats); err != nil {
		t.Fatal(err)
	}
	wantKeys := []string{"db_now", "dead", "due", "in_flight", "max_attempts", "oldest_pending_age_ms", "oldest_pending_at", "pending", "topic"}
	if len(stats) != 2 || !slices.Equal(slices.Sorted(maps.Keys(stats[0])), wantKeys) {
		t.Fatalf("stats %s", out)
	}
	if stats[0]["topic"] != "audit" || stats[0]["dead"] != 1.0 || stats[0]["pending"] != 0.0 || stats[0]["oldest_pending_at"] != nil ||
		stats[1]["topic"] != "orders" || stats[1]["pending"] != 2.0 || stats[1]["due"] != 2.0 {
		t.Fatalf("stats %s", out)
	}
	if code, out, _ := d.run(t, "outbox", "stats"); code != cli.ExitOK || !strings.Contains(out, "OLDEST PENDING") || !strings.Contains(out, "orders") {
		t.Fatalf("outbox stats = %d\n%s", code, out)
	}

	// list reads no payload unless --payload-bytes asks for (the start of) each.
	code, out, errOut = d.run(t, "--json", "outbox", "list", "--dead")
	var dead []map[string]any
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &dead) != nil || len(dead) != 1 ||
		dead[0]["id"] != float64(ids[2]) || dead[0]["last_error"] != "downstream said no" || dead[0]["payload_size"] != 8.0 ||
		dead[0]["payload"] != nil || dead[0]["payload_base64"] != nil {
		t.Fatalf("outbox list --dead --json = %d %s %s; want the payload's size, not the payload", code, out, errOut)
	}
	code, out, errOut = d.run(t, "--json", "outbox", "list", "--dead", "--payload-bytes", "100")
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &dead) != nil || len(dead) != 1 || dead[0]["payload"] != "poison" {
		t.Fatalf("outbox list --dead --json --payload-bytes 100 = %d %s %s", code, out, errOut)
	}
	code, out, errOut = d.run(t, "--json", "outbox", "list", "--dead", "--payload-bytes", "3")
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &dead) != nil || len(dead) != 1 || dead[0]["payload"] != nil ||
		dead[0]["payload_base64"] != "InBv" { // base64 of `"po`
		t.Fatalf("outbox list --dead --json --payload-bytes 3 = %d %s %s; want the first 3 bytes in base64", code, out, errOut)
	}
	for _, args := range [][]string{{"--payload-bytes", "5"}, {"--json", "--payload-bytes", "-1"}, {"--json", "--payload-bytes", "1048577"}} {
		if code, _, _ := d.run(t, append([]string{"outbox", "list"}, args...)...); code != cli.ExitUsage {
			t.Errorf("outbox list %v: exit %d, want %d", args, code, cli.ExitUsage)
		}
	}
	if code, out, _ := d.run(t, "outbox", "list", "--topic", "orders"); code != cli.ExitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, "o-2") {
		t.Fatalf("outbox list --topic orders = %d\n%s", code, out)
	}

	// show: one whole message.
	if code, out, errOut := d.run(t, "outbox", "show", fmt.Sprint(ids[2])); code != cli.ExitOK ||
		!strings.Contains(out, "downstream said no") || !strings.Contains(out, "8 bytes of JSON") || !strings.Contains(out, `"poison"`) {
		t.Fatalf("outbox show = %d %q %q", code, out, errOut)
	}
	var one map[string]any
	if code, out, errOut := d.run(t, "--json", "outbox", "show", fmt.Sprint(ids[1])); code != cli.ExitOK ||
		json.Unmarshal([]byte(out), &one) != nil || one["id"] != float64(ids[1]) || one["payload_size"] != 7.0 {
		t.Fatalf("outbox show --json = %d %q %q", code, out, errOut)
	}
	if p, _ := json.Marshal(one["payload"]); string(p) != `{"n":2}` {
		t.Fatalf("outbox show --json: payload %s", p)
	}
	if code, _, _ := d.run(t, "outbox", "show", "x"); code != cli.ExitUsage {
		t.Errorf("outbox show x: exit %d, want %d", code, cli.ExitUsage)
	}
	if code, _, errOut := d.run(t, "outbox", "show", "999999"); code != cli.ExitFailure || !strings.Contains(errOut, "no such message") {
		t.Errorf("outbox show of an unknown id: %d %q", code, errOut)
	}
	if code, out, _ := d.run(t, "--json", "outbox", "list", "--state", "delivered"); code != cli.ExitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("empty list = %d %q, want []", code, out)
	}
	if code, _, _ := d.run(t, "outbox", "list", "--state", "lost"); code != cli.ExitUsage {
		t.Fatalf("bad --state: exit %d, want %d", code, cli.ExitUsage)
	}

	// retry: dry run changes nothing; then the dead message is pending again.
	if code, out, _ := d.run(t, "outbox", "retry", "--all-dead", "--dry-run"); code != cli.ExitOK || !strings.Contains(out, "1 dead messages would be retried") {
		t.Fatalf("retry --all-dead --dry-run = %d %q", code, out)
	}
	if m, _ := outbox.Get(t.Context(), d.pool, ids[2]); m.State != outbox.Dead {
		t.Fatalf("dry run changed the message: %+v", m)
	}
	if code, out, errOut := d.run(t, "outbox", "retry", fmt.Sprint(ids[2])); code != cli.ExitOK || !strings.Contains(out, "retried message") {
		t.Fatalf("retry ID = %d %q %q", code, out, errOut)
	}
	if m, _ := outbox.Get(t.Context(), d.pool, ids[2]); m.State != outbox.Pending || m.Attempts != 0 {
		t.Fatalf("after retry: %+v", m)
	}
	for _, args := range [][]string{{"retry"}, {"retry", "x"}, {"retry", "1", "--all-dead"}, {"retry", "1", "--topic", "t"}} {
		if code, _, _ := d.run(t, append([]string{"outbox"}, args...)...); code != cli.ExitUsage {
			t.Errorf("outbox %v: exit %d, want %d", args, code, cli.ExitUsage)
		}
	}
	if code, _, errOut := d.run(t, "outbox", "retry", "999999"); code != cli.ExitFailure || !strings.Contains(errOut, "no such message") {
		t.Fatalf("retry of an unknown id: %d %q", code, errOut)
	}
}

func TestOutboxRelayUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"outbox", "relay"}, {"outbox", "relay", "--sink", "kafka"}, {"outbox", "relay", "--sink", "webhook=ftp://x"},
		{"outbox", "gc", "--older-than", "0s"}, {"outbox", "gc", "--batch", "0"}, {"outbox", "bogus"},
	} {
		if code, _, errOut := run(t, append([]string{"--database-url", "postgres://127.0.0.1:1/none"}, args...)...); code != cli.ExitUsage {
			t.Errorf("pgcoord %v: exit %d (%s), want %d", args, code, errOut, cli.ExitUsage)
		}
	}
}

func TestOutboxGC(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	obEnqueue(t, d.pool, obMsg("orders", "a", "1"), obMsg("orders", "b", "2"), obMsg("orders", "c", "3"))
	r, err := outbox.NewRelay(d.pool, &outbox.Config{Handler: outbox.HandlerFunc(func(context.Context, outbox.Message) error { return nil })})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunBatch(t.Context()); err != nil {
		t.Fatal(err)
	}
	obEnqueue(t, d.pool, obMsg("orders", "p", "4"))
	if code, out, _ := d.run(t, "--json", "outbox", "gc", "--older-than", "1us", "--dry-run"); code != cli.ExitOK ||
		strings.Join(strings.Fields(out), "") != `{"deleted":0,"would_delete":3,"dry_run":true}` {
		t.Fatalf("gc --dry-run = %d %q", code, out)
	}
	if code, out, _ := d.run(t, "outbox", "gc", "--older-than", "1us", "--batch", "2"); code != cli.ExitOK || out != "deleted 3 outbox messages in 2 batches\n" {
		t.Fatalf("gc = %d %q", code, out)
	}
	if s, _ := outbox.Stats(t.Context(), d.pool, nil); len(s) != 1 || s[0].Pending != 1 {
		t.Fatalf("after gc: %+v; want the pending message kept", s)
	}
}
