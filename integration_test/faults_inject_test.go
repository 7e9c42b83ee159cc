//go:build unix

package integration_test

import (
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// injectFaults injects a random fault every few hundred milliseconds for d.
func (h *faultHarness) injectFaults(d time.Duration) {
	deadline := time.Now().Add(d)
	lastRestart := time.Now()
	generation := map[string]int{}
	for time.Now().Before(deadline) {
		time.Sleep(h.between(300*time.Millisecond, 900*time.Millisecond))
		var fault string
		switch r := h.rng.IntN(100); {
		case r < 35: // a GC pause, past the lease
			name, w := h.pick()
			pause := h.between(200*time.Millisecond, 1200*time.Millisecond)
			fault = fmt.Sprintf("SIGSTOP %s for %v", name, pause)
			if w.Signal(syscall.SIGSTOP) == nil {
				time.AfterFunc(pause, func() { _ = w.Signal(syscall.SIGCONT) })
			}
		case r < 50: // a crash
			name, w := h.pick()
			fault = "SIGKILL " + name
			_ = w.Signal(syscall.SIGKILL)
			h.mu.Lock()
			delete(h.workers, name)
			h.mu.Unlock()
			base, _, _ := strings.Cut(name, ".") // its replacement: w3 -> w3.1 -> w3.2 ...
			generation[base]++
			h.startWorker(fmt.Sprintf("%s.%d", base, generation[base]))
		case r < 62:
			fault = "pg_terminate_backend of a worker's connection"
			_, _ = h.admin.Exec(h.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = 'pgcoord-test-worker' ORDER BY random() LIMIT 1`)
		case r < 77:
			lat := h.between(20*time.Millisecond, 150*time.Millisecond)
			fault = fmt.Sprintf("network latency %v per chunk", lat)
			h.workerProxy.SetLatency(lat)
			time.AfterFunc(h.between(500*time.Millisecond, 2*time.Second), func() { h.workerProxy.SetLatency(0) })
		case r < 83:
			rate := 2000 + h.rng.Int64N(20000) // bytes/s: a congested link
			fault = fmt.Sprintf("network throttled to %d bytes/s", rate)
			h.workerProxy.SetRate(rate)
			time.AfterFunc(h.between(500*time.Millisecond, 2*time.Second), func() { h.workerProxy.SetRate(0) })
		case r < 92:
			cut := h.between(200*time.Millisecond, 800*time.Millisecond)
			fault = fmt.Sprintf("network cut for %v", cut)
			h.workerProxy.Cut(cut)
		case time.Since(lastRestart) > 6*time.Second:
			mode := []string{"fast", "immediate"}[h.rng.IntN(2)]
			fault = "server restart, " + mode + " shutdown"
			h.restartServer(mode)
			lastRestart = time.Now()
		default:
			continue
		}
		h.faults = append(h.faults, fault)
	}
	h.t.Logf("%d faults: %s", len(h.faults), strings.Join(h.faults, "; "))
}

// restartServer stops PostgreSQL in its container (the container stops with it) and starts
// the container again; the server comes back from crash recovery after an immediate
// shutdown, and on another host port, which the proxies follow.
func (h *faultHarness) restartServer(mode string) {
	h.t.Helper()
	docker := func(args ...string) string {
		out, err := exec.CommandContext(h.ctx, "docker", args...).CombinedOutput()
		if err != nil {
			h.t.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	_, _ = exec.CommandContext(h.ctx, "docker", "exec", "-u", "postgres", h.container, "sh", "-c",
		`"$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)/pg_ctl" -D "${PGDATA:-/var/lib/postgresql/data}" stop -m `+mode).CombinedOutput()
	docker("wait", h.container)
	docker("start", h.container)
	first := strings.SplitN(docker("port", h.container, "5432/tcp"), "\n", 2)[0] // 0.0.0.0:32768
	target := "127.0.0.1:" + first[strings.LastIndex(first, ":")+1:]
	h.workerProxy.SetTarget(target)
	h.adminProxy.SetTarget(target)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := h.admin.Exec(h.ctx, "SELECT 1"); err == nil {
			return
		} else if time.Now().After(deadline) {
			h.t.Fatalf("server not back 60s after a restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopWorkers lets every worker finish and waits for them, bounded.
func (h *faultHarness) stopWorkers() {
	if h.workerProxy != nil {
		h.workerProxy.SetLatency(0)
		h.workerProxy.SetRate(0)
	}
	h.mu.Lock()
	live := slices.Collect(maps.Values(h.workers))
	h.mu.Unlock()
	time.Sleep(1500 * time.Millisecond) // every SIGSTOP's SIGCONT has fired
	for _, w := range live {
		_ = w.Signal(syscall.SIGCONT)
		_ = w.Send("stop")
	}
	for _, w := range live {
		if err := w.Wait(30 * time.Second); err != nil {
			h.t.Errorf("worker %s: %v; stderr: %s", w.Name(), err, w.Stderr())
		}
	}
	h.wg.Wait()
}
