package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// gate is a run function that records each batch and holds it until released.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	ctxs    []context.Context
	arrived chan int           // the batch's index, once it is running
	release chan error         // one per batch: nil answers it, an error fails it
	answer  func(int) []string // results of a batch of items (default: "r<item>")
}

func newGate() *gate {
	return &gate{arrived: make(chan int, 100), release: make(chan error, 100)}
}

func (g *gate) run(ctx context.Context, items []int) ([]string, error) {
	g.mu.Lock()
	g.batches = append(g.batches, slices.Clone(items))
	g.ctxs = append(g.ctxs, ctx)
	i := len(g.batches) - 1
	g.mu.Unlock()
	g.arrived <- i
	select {
	case err := <-g.release:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rs := make([]string, len(items))
	for j, it := range items {
		rs[j] = fmt.Sprintf("r%d", it)
	}
	return rs, nil
}

func (g *gate) batch(i int) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.batches[i]
}

// waitingBehind returns how many calls of key wait behind its batch in flight.
func waitingBehind[T, R any](b *Batcher[T, R], key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q, ok := b.queues[key]; ok {
		return len(q.waiting)
	}
	return -1
}

// until waits for cond, at most 10 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

type result struct {
	item int
	res  string
	err  error
}

// start calls b.Do(ctx, key, item) on its own goroutine and sends the outcome to out.
func start(b *Batcher[int, string], ctx context.Context, key string, item int, out chan<- result) {
	go func() {
		r, err := b.Do(ctx, key, item)
		out <- result{item, r, err}
	}()
}

type ctxKey struct{}

func TestLoneCallGoesOutAtOnceOnItsOwnContext(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	ctx := context.WithValue(context.Background(), ctxKey{}, "mine")
	g.release <- nil
	r, err := b.Do(ctx, "k", 1)
	if err != nil || r != "r1" {
		t.Fatalf("Do = %q, %v", r, err)
	}
	if g.ctxs[0] != ctx {
		t.Error("a lone call did not run on its own context")
	}
	if waitingBehind(b, "k") != -1 {
		t.Error("the key is still marked busy after its only call returned")
	}
}

func TestCallsArrivingDuringABatchGoOutTogetherInArrivalOrder(t *testing.T) {
	g := newGate()
	b := New(100, g.run)
	out := make(chan result, 20)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived // batch 0: the first call alone, held
	for i := 1; i <= 10; i++ {
		start(b, context.Background(), "k", i, out)
		until(t, "call queued", func() bool { return waitingBehind(b, "k") == i })
	}
	g.release <- nil // batch 0 returns; the ten go out as batch 1
	<-g.arrived
	if got, want := g.batch(1), []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}; !slices.Equal(got, want) {
		t.Fatalf("second batch = %v, want %v", got, want)
	}
	g.release <- nil
	for range 11 {
		r := <-out
		if r.err != nil || r.res != fmt.Sprintf("r%d", r.item) {
			t.Errorf("call %d: %q, %v", r.item, r.res, r.err)
		}
	}
	until(t, "key idle", func() bool { return waitingBehind(b, "k") == -1 })
}

func TestBatchesAreAtMostMaxItems(t *testing.T) {
	g := newGate()
	b := New(3, g.run)
	out := make(chan result, 20)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	for i := 1; i <= 7; i++ {
		start(b, context.Background(), "k", i, out)
		until(t, "call queued", func() bool { return waitingBehind(b, "k") == i })
	}
	for range 4 {
		g.release <- nil
	}
	for range 8 {
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		}
	}
	var sizes []int
	for i := range 4 {
		sizes = append(sizes, len(g.batch(i)))
	}
	if !slices.Equal(sizes, []int{1, 3, 3, 1}) {
		t.Errorf("batch sizes %v, want [1 3 3 1]", sizes)
	}
}

func TestKeysDoNotWaitForEachOther(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	out := make(chan result, 2)
	start(b, context.Background(), "a", 1, out)
	<-g.arrived // a's batch held
	start(b, context.Background(), "b", 2, out)
	<-g.arrived // b's batch went out beside it, not behind it
	g.release <- nil
	g.release <- nil
	for range 2 {
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		}
	}
}

func TestACallCancelledBeforeItIsSentIsDropped(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	out := make(chan result, 3)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	ctx, cancel := context.WithCancel(context.Background())
	start(b, ctx, "k", 1, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 1 })
	start(b, context.Background(), "k", 2, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 2 })
	cancel()
	if r := <-out; r.item != 1 || !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrUnknown) {
		t.Fatalf("cancelled waiting call: %+v, want context.Canceled without ErrUnknown", r)
	}
	g.release <- nil
	<-g.arrived
	if got := g.batch(1); !slices.Equal(got, []int{2}) {
		t.Fatalf("next batch = %v: the cancelled call was sent", got)
	}
	g.release <- nil
	for range 2 {
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		}
	}
}

func TestACallCancelledInFlightSaysItsOutcomeIsUnknown(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	out := make(chan result, 3)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	start(b, ctx1, "k", 1, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 1 })
	start(b, ctx2, "k", 2, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 2 })
	g.release <- nil
	<-g.arrived // batch 1 = calls 1 and 2, in flight
	if r := <-out; r.item != 0 || r.err != nil {
		t.Fatalf("first call: %+v", r)
	}
	cancel1()
	r := <-out
	if r.item != 1 || !errors.Is(r.err, ErrUnknown) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("call cancelled in flight: %+v, want ErrUnknown and context.Canceled", r)
	}
	g.mu.Lock()
	batchCtx := g.ctxs[1]
	g.mu.Unlock()
	if batchCtx.Err() != nil {
		t.Fatal("the batch was cancelled while one of its callers still waits")
	}
	cancel2() // the last caller gone: the batch is cancelled
	if r := <-out; r.item != 2 || !errors.Is(r.err, ErrUnknown) {
		t.Fatalf("second call: %+v", r)
	}
	until(t, "batch cancelled", func() bool { return batchCtx.Err() != nil })
	until(t, "key idle", func() bool { return waitingBehind(b, "k") == -1 })
}

func TestABatchThatFailsFailsEachOfItsCalls(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	out := make(chan result, 4)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	for i := 1; i <= 3; i++ {
		start(b, context.Background(), "k", i, out)
		until(t, "call queued", func() bool { return waitingBehind(b, "k") == i })
	}
	g.release <- nil
	<-g.arrived
	boom := errors.New("backend gone")
	g.release <- boom
	failed := 0
	for range 4 {
		r := <-out
		if r.item > 0 {
			if !errors.Is(r.err, boom) {
				t.Errorf("call %d: %v, want the batch's error", r.item, r.err)
			}
			failed++
		}
	}
	if failed != 3 {
		t.Errorf("%d calls failed, want 3", failed)
	}
}

func TestABatchMustAnswerEachItem(t *testing.T) {
	b := New(10, func(context.Context, []int) ([]string, error) { return nil, nil })
	if _, err := b.Do(context.Background(), "k", 1); err == nil {
		t.Fatal("a batch that returned no result for its item was taken as an answer")
	}
}
