// Command redisgcra measures a Redis GCRA rate limiter (the go-redis rate package,
// redis_rate) the way `pgcoord bench` measures pgcoord's ratelimit scenarios, so the two
// can be set side by side: decisions per second at each concurrency, one connection per
// worker, in alternating rounds against a round-trip floor (PING on the same connections),
// the result being the median of the rounds' throughputs.
//
// It is a module of its own so that pgcoord's main module has no Redis dependency. It
// needs a running Redis; `make bench-redis` (scripts/bench-redis.sh) starts a throwaway one
// without persistence, runs this program against it and stops it.
//
//	go run . --addr 127.0.0.1:6379 --duration 2s
//
// Scenarios:
//
//	redis.allow    redis_rate Allow of 1 unit on the worker's own key
//	redis.hot_key  redis_rate Allow of 1 unit, every worker on one key
//
// The policy admits everything a bench can ask for: a million units a second in bursts of
// a billion (a tolerance of 1,000 s), so every call is admitted and writes its key: the
// measure is the cost of a decision. Not a billion a second, as pgcoord's bench policies
// are: redis_rate keeps the arrival time as a float of seconds since 2017, whose precision
// (about 60 ns) is coarser than a billionth of a second, so the arrival time would not
// move and the script would skip its write.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

const (
	floorName      = "redis.ping"
	round          = 250 * time.Millisecond
	maxConcurrency = 1000
	maxDuration    = time.Hour
)

// policy admits every call of the bench (see the package doc).
var policy = redis_rate.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000_000}

type scenario struct {
	name string
	hot  bool // every worker on one key
}

var scenarios = []scenario{{"redis.allow", false}, {"redis.hot_key", true}}

// op is one operation of a worker.
type op func(ctx context.Context) error

// result is one line of the report, in the shape of `pgcoord bench --json`.
type result struct {
	Bench          string  `json:"bench"`
	Concurrency    int     `json:"concurrency"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	P50MS          float64 `json:"p50_ms"`
	P99MS          float64 `json:"p99_ms"`
	Floor          string  `json:"floor"`
	FloorOpsPerSec float64 `json:"floor_ops_per_sec"`
	Ratio          float64 `json:"ratio"`
	Rounds         int     `json:"rounds"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redisgcra:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address (host:port); the bench writes keys under redisgcra:<hex>: and deletes them at the end")
	cs := flag.String("concurrency", "1,8,32", "comma-separated numbers of concurrent workers (one connection each)")
	duration := flag.Duration("duration", 5*time.Second, "measuring time per scenario per concurrency (the floor runs as long again, interleaved)")
	only := flag.String("only", "", "run only the scenarios whose name starts with this prefix (redis.allow, redis.hot_key)")
	asJSON := flag.Bool("json", false, "print one JSON object per result, as `pgcoord bench --json` does")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if *duration <= 0 || *duration > maxDuration {
		return fmt.Errorf("--duration %v: want more than 0 and at most %v", *duration, maxDuration)
	}
	concurrency, err := parseConcurrency(*cs)
	if err != nil {
		return err
	}
	var selected []scenario
	for _, s := range scenarios {
		if strings.HasPrefix(s.name, *only) {
			selected = append(selected, s)
		}
	}
	if len(selected) == 0 {
		return fmt.Errorf("--only %q matches no scenario (redis.allow, redis.hot_key)", *only)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: slices.Max(concurrency) + 1})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis at %s: %w", *addr, err)
	}
	fmt.Fprintf(os.Stderr, "redis %s at %s; policy %d per %v, burst %d\n",
		infoField(info, "redis_version"), *addr, policy.Rate, policy.Period, policy.Burst)

	prefix, err := randomPrefix()
	if err != nil {
		return err
	}
	var keys []string
	defer func() {
		// Delete what the bench wrote, also after an error or Ctrl-C.
		if len(keys) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				fmt.Fprintln(os.Stderr, "redisgcra: deleting the bench's keys:", err)
			}
		}
	}()

	var results []result
	enc := json.NewEncoder(os.Stdout)
	for _, s := range selected {
		for _, c := range concurrency {
			r, ks, err := measure(ctx, rdb, prefix, s, c, *duration)
			keys = append(keys, ks...)
			if err != nil {
				printTable(results, *asJSON)
				return err
			}
			if *asJSON {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
			results = append(results, r)
		}
	}
	printTable(results, *asJSON)
	return nil
}

// measure runs s and the PING floor at concurrency c, alternating in rounds on the same c
// connections. It returns the keys it charged.
func measure(ctx context.Context, rdb *redis.Client, prefix string, s scenario, c int, d time.Duration) (result, []string, error) {
	n := max(int(d/round), min(3, int(d/(50*time.Millisecond))), 1)
	per := d / time.Duration(n)
	res := result{Bench: s.name, Concurrency: c, Floor: floorName, Rounds: n}
	where := fmt.Sprintf("%s c=%d", s.name, c)

	conns := make([]*redis.Conn, 0, c)
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	var keys []string
	ops := make([]op, c)
	floors := make([]op, c)
	for i := range c {
		conn := rdb.Conn()
		conns = append(conns, conn)
		// Check out the connection now: the first round should not pay for dialling.
		if err := conn.Ping(ctx).Err(); err != nil {
			return res, keys, fmt.Errorf("%s: worker %d: %w", where, i, err)
		}
		key := prefix + s.name + ":w" + strconv.Itoa(i)
		if s.hot {
			key = prefix + s.name + ":hot"
		}
		if i == 0 || !s.hot {
			keys = append(keys, "rate:"+key) // redis_rate's prefix
		}
		limiter := redis_rate.NewLimiter(conn)
		ops[i] = func(ctx context.Context) error {
			r, err := limiter.Allow(ctx, key, policy)
			if err != nil {
				return fmt.Errorf("redis_rate Allow: %w", err)
			}
			if r.Allowed != 1 {
				return errors.New("redis_rate Allow refused a call: the bench policy admits a million a second")
			}
			return nil
		}
		floors[i] = func(ctx context.Context) error { return conn.Ping(ctx).Err() }
	}

	lat := make([][]time.Duration, c)
	var rates, floorRates []float64
	for range n {
		rate, err := runRound(ctx, ops, per, lat)
		if err != nil {
			return res, keys, fmt.Errorf("%s: %w", where, err)
		}
		rates = append(rates, rate)
		if rate, err = runRound(ctx, floors, per, nil); err != nil {
			return res, keys, fmt.Errorf("%s: floor %s: %w", where, floorName, err)
		}
		floorRates = append(floorRates, rate)
	}
	res.OpsPerSec, res.FloorOpsPerSec = median(rates), median(floorRates)
	if res.FloorOpsPerSec > 0 {
		res.Ratio = res.OpsPerSec / res.FloorOpsPerSec
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	res.P50MS, res.P99MS = ms(quantile(all, 0.50)), ms(quantile(all, 0.99))
	res.OpsPerSec, res.FloorOpsPerSec = round1(res.OpsPerSec), round1(res.FloorOpsPerSec)
	res.Ratio = float64(int64(res.Ratio*1e4+0.5)) / 1e4
	return res, keys, nil
}

// runRound runs every op in its own goroutine, again and again, until d has passed (an op
// started before then completes and counts; each runs at least once), and returns their
// rate over the round's wall time. It appends each op's latency to lat[worker] when lat is
// not nil. The first error stops the round.
func runRound(ctx context.Context, ops []op, d time.Duration, lat [][]time.Duration) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	counts := make([]int64, len(ops))
	start := time.Now()
	end := start.Add(d)
	for i, o := range ops {
		wg.Go(func() {
			var n int64
			for first := true; ; first = false {
				t0 := time.Now()
				if !first && !t0.Before(end) {
					break
				}
				if err := o(ctx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("worker %d: %w", i, err)
						cancel()
					}
					mu.Unlock()
					break
				}
				if lat != nil {
					lat[i] = append(lat[i], time.Since(t0))
				}
				n++
			}
			counts[i] = n
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	var total int64
	for _, n := range counts {
		total += n
	}
	return float64(total) / elapsed.Seconds(), nil
}

func printTable(results []result, asJSON bool) {
	if asJSON || len(results) == 0 {
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tWORKERS\tOPS/S\tP50 MS\tP99 MS\tFLOOR\tFLOOR OPS/S\tRATIO")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.3f\t%.3f\t%s\t%.1f\t%.3f\n",
			r.Bench, r.Concurrency, r.OpsPerSec, r.P50MS, r.P99MS, r.Floor, r.FloorOpsPerSec, r.Ratio)
	}
	tw.Flush()
}

func parseConcurrency(s string) ([]int, error) {
	var cs []int
	for f := range strings.SplitSeq(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 || c > maxConcurrency {
			return nil, fmt.Errorf("--concurrency %q: want numbers of workers from 1 to %d, comma-separated", f, maxConcurrency)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func randomPrefix() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "redisgcra:" + hex.EncodeToString(b) + ":", nil
}

// infoField returns the value of field in the text of Redis's INFO.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return "?"
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// quantile returns the q-quantile of sorted (nearest rank), 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(int64(float64(d)/1e3+0.5)) / 1e3 }

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
