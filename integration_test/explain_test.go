//go:build unix

package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// The explanation of a failed chaos test: what its processes last wrote to stderr, then
// what the database holds. CI keeps the end of a failed test's output, so callers log the
// processes first and the database last.

// explainStderrLines is how much of each process's stderr an explanation shows.
const explainStderrLines = 15

// logStderrTail logs the last explainStderrLines lines of what p wrote to stderr.
func logStderrTail(t testing.TB, p *workerproc.Proc) {
	lines := strings.Split(strings.TrimSpace(p.Stderr()), "\n")
	t.Logf("%s's stderr (its last %d lines):\n%s", p.Name(), min(len(lines), explainStderrLines),
		strings.Join(lines[max(0, len(lines)-explainStderrLines):], "\n"))
}

// logRows logs the rows query returns under title, a line each. It waits at most 10 s: a
// failed test's database may be wedged, which is what the explanation is for.
func logRows(t testing.TB, pool *pgxpool.Pool, title, query string, args ...any) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		t.Logf("%s: %v", title, err)
		return
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Logf("%s: %v", title, err)
			return
		}
		fmt.Fprintln(&b, vals...)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintln(&b, err)
	}
	t.Logf("%s:\n%s", title, b.String())
}

// logGroup logs a partition group's members and its partitions that are not held by the
// member the plan gives them to.
func logGroup(t testing.TB, pool *pgxpool.Pool, group string) {
	logRows(t, pool, "partitions not held by their target (partition, target, holder, token, expires in)", `
		SELECT partition, target, holder, fence_token, (expires_at - clock_timestamp())::text
		  FROM pgcoord_partitions
		 WHERE group_name = $1 AND NOT (holder IS NOT DISTINCT FROM target AND expires_at > clock_timestamp())
		 ORDER BY partition`, group)
	logMembers(t, pool, group)
}

// logMembers logs a partition group's members.
func logMembers(t testing.TB, pool *pgxpool.Pool, group string) {
	logRows(t, pool, "members (member, weight, expires in, draining)", `
		SELECT member, weight, (expires_at - clock_timestamp())::text, draining_at::text FROM pgcoord_partition_members
		 WHERE group_name = $1 ORDER BY member`, group)
}

// logSessions logs the database's sessions at work, with what they wait for and who
// blocks them.
func logSessions(t testing.TB, pool *pgxpool.Pool) {
	logRows(t, pool, "sessions (pid, application, state, wait, in transaction for, blocked by, query)", `
		SELECT pid, application_name, state, wait_event_type || ':' || wait_event, (clock_timestamp() - xact_start)::text,
		       pg_blocking_pids(pid)::text, left(query, 120)
		  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`)
}

// chaosTurn lets one chaos test at a time run its processes: TestFaults,
// TestFaultChecksCatchUnfencedWrites, TestPartitionChaos and
// TestOutboxWithRealProcessesKillsAndPauses each run a partition group of real processes
// (TTL 1 to 2 s) under injected faults. Run together beside CI's two CPU hogs on a 2-core
// machine, their groups stopped granting (every member's heartbeat failing for 40 s and
// more). What made that last — a heartbeat cut off at its TTL closed its connection, and
// the next, on a cold backend, was slower still — is fixed in the partition package;
// taking turns still bounds how starved each test's database is. See docs/partitions.md,
// Failure modes.
var chaosTurn = make(chan struct{}, 1)

// takeChaosTurn waits for the chaos tests before t to end, and gives the turn on when t
// ends.
func takeChaosTurn(t *testing.T) {
	t.Helper()
	select {
	case chaosTurn <- struct{}{}:
	case <-t.Context().Done():
		t.Fatal("waiting for the other chaos tests to end:", t.Context().Err())
	}
	t.Cleanup(func() { <-chaosTurn })
}
