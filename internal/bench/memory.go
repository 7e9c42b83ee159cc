package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/leases"
)

// MemoryOptions configure Memory. A nil *MemoryOptions means the defaults.
type MemoryOptions struct {
	// Waiters is how many leases.Acquire calls wait at once for one held lease. Default
	// DefaultMemoryWaiters; 1 to MaxMemoryWaiters.
	Waiters int
	// Leases is how many leases are held and each renewed once. Default
	// DefaultMemoryLeases; 1 to MaxMemoryLeases.
	Leases int
	// Workers is how many goroutines take and renew the leases, through one pool of as
	// many connections (which coalesces their calls). Default 64; 1 to 1,000.
	Workers int
}

// Defaults and bounds of MemoryOptions (the figures: 10,000 waiters, 100,000 leases).
const (
	DefaultMemoryWaiters = 10_000
	DefaultMemoryLeases  = 100_000
	MaxMemoryWaiters     = 1_000_000
	MaxMemoryLeases      = 10_000_000
)

// MemoryResult is what Memory measured.
type MemoryResult struct {
	// Waiters blocked at once; RSSPerWaiter and HeapPerWaiter are the growth of the
	// process's resident memory (VmRSS) and of its live heap, from before they started to
	// when all were waiting, divided by Waiters, in bytes, each read after garbage
	// collections and with freed memory given back to the system (see memoryNow).
	Waiters                     int
	RSSPerWaiter, HeapPerWaiter float64
	// Leases renewed once each, how fast, and the process's CPU time (user and system) per
	// renewal.
	Leases         int
	RenewalsPerSec float64
	CPUPerRenewal  time.Duration
}

// Memory measures what waiting and renewing cost the client, in a bench schema of its own:
// the memory of opts.Waiters leases.Acquire calls blocked on one lease (each holds no
// connection: they share the pool's LISTEN), and the CPU time of renewing opts.Leases held
// leases once each from opts.Workers goroutines through one pool.
func Memory(ctx context.Context, cfg *pgxpool.Config, opts *MemoryOptions) (res MemoryResult, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return res, err
	}
	c := cfg.Copy()
	c.MaxConns = int32(o.Workers) + 2 // exactly: the waiters' measure opens them all
	err = inBenchSchema(ctx, c, o.Workers+2, nil, func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
		if err := measureWaiters(ctx, pool, o.Waiters, &res); err != nil {
			return err
		}
		return measureRenewals(ctx, pool, o.Leases, o.Workers, &res)
	})
	return res, err
}

// measureWaiters starts n leases.Acquire calls on a lease held for an hour, waits until
// each has sent its first attempt and none holds a connection, and reads the memory.
func measureWaiters(ctx context.Context, pool *pgxpool.Pool, n int, res *MemoryResult) (err error) {
	const name = "memory.held"
	if _, err = leases.TryAcquire(ctx, pool, name, time.Hour, &leases.AcquireOpts{Holder: "memory"}); err != nil {
		return fmt.Errorf("bench: memory: hold the lease: %w", err)
	}
	// Every connection of the pool open before the first reading: the waiters' first
	// attempts would open them, and their buffers are not the waiters'.
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return fmt.Errorf("bench: memory: open the pool's connections: %w", err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	rss0, heap0, err := memoryNow()
	if err != nil {
		return err
	}
	before := pool.Stat().AcquireCount()
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range n {
		wg.Go(func() {
			// An hour between polls: only a notification (none comes) or the end wakes it.
			_, err := leases.Acquire(wctx, pool, name, time.Minute, &leases.AcquireOpts{PollInterval: time.Hour})
			if err != nil && wctx.Err() == nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	// Each waiter's first attempt takes a connection once; then it waits, holding none.
	for pool.Stat().AcquireCount()-before < int64(n) || pool.Stat().AcquiredConns() > 0 {
		select {
		case err := <-errs:
			return fmt.Errorf("bench: memory: a waiter: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	rss1, heap1, err := memoryNow()
	if err != nil {
		return err
	}
	res.Waiters = n
	res.RSSPerWaiter = float64(int64(rss1)-int64(rss0)) / float64(n)
	res.HeapPerWaiter = float64(int64(heap1)-int64(heap0)) / float64(n)
	return nil
}

// measureRenewals takes n leases, then renews each once, and times the renewals' CPU.
func measureRenewals(ctx context.Context, pool *pgxpool.Pool, n, workers int, res *MemoryResult) error {
	held := make([]leases.Lease, n)
	if err := fanOut(n, workers, func(i int) error {
		l, err := leases.TryAcquire(ctx, pool, fmt.Sprintf("memory.renew/%d", i), time.Hour, nil)
		held[i] = l
		return err
	}); err != nil {
		return fmt.Errorf("bench: memory: take the leases: %w", err)
	}
	cpu0, err := cpuTime()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := fanOut(n, workers, func(i int) error {
		_, err := leases.Renew(ctx, pool, held[i], time.Hour, nil)
		return err
	}); err != nil {
		return fmt.Errorf("bench: memory: renew: %w", err)
	}
	elapsed := time.Since(start)
	cpu1, err := cpuTime()
	if err != nil {
		return err
	}
	res.Leases = n
	res.RenewalsPerSec = float64(n) / elapsed.Seconds()
	res.CPUPerRenewal = (cpu1 - cpu0) / time.Duration(n)
	return nil
}

// fanOut calls f(0) .. f(n-1) from workers goroutines and returns their errors.
func fanOut(n, workers int, f func(i int) error) error {
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for {
				next.Lock()
				j := i
				i++
				next.Unlock()
				if j >= n || errs[w] != nil {
					return
				}
				errs[w] = f(j)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// memoryNow returns the process's resident set (VmRSS) and live heap as a long-lived
// process would have them: after a few garbage collections (each halves the stacks of
// goroutines that use less than a quarter of theirs, as waiters parked after a deep call
// do) and with the freed memory given back to the system, as its scavenger would.
func memoryNow() (rss, heap uint64, err error) {
	for range 3 {
		runtime.GC()
	}
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: memory: %w (it reads Linux's /proc)", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("bench: memory: VmRSS %q: %w", v, err)
			}
			return kb << 10, m.HeapInuse, nil
		}
	}
	return 0, 0, errors.New("bench: memory: no VmRSS in /proc/self/status")
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("bench: memory: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

func (opts *MemoryOptions) withDefaults() (MemoryOptions, error) {
	var o MemoryOptions
	if opts != nil {
		o = *opts
	}
	if o.Waiters == 0 {
		o.Waiters = DefaultMemoryWaiters
	}
	if o.Leases == 0 {
		o.Leases = DefaultMemoryLeases
	}
	if o.Workers == 0 {
		o.Workers = 64
	}
	if o.Workers < 1 || o.Workers > 1000 {
		return o, fmt.Errorf("bench: memory: %d workers: want 1 to 1000", o.Workers)
	}
	if o.Waiters < 1 || o.Waiters > MaxMemoryWaiters {
		return o, fmt.Errorf("bench: memory: %d waiters: want 1 to %d", o.Waiters, MaxMemoryWaiters)
	}
	if o.Leases < 1 || o.Leases > MaxMemoryLeases {
		return o, fmt.Errorf("bench: memory: %d leases: want 1 to %d", o.Leases, MaxMemoryLeases)
	}
	return o, nil
}
