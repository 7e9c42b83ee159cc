package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Each sends one call alone; several together in the order of their keys, arrival order
// among equal keys, and gives each result back to its own call.
func TestEachRunsABatchInKeyOrder(t *testing.T) {
	key := func(s string) string { return s[:1] }
	alone := func(_ context.Context, s string) string { return "alone " + s }
	var sent []string
	together := func(_ context.Context, cs []string) ([]string, error) {
		sent = slices.Clone(cs)
		out := make([]string, len(cs))
		for i, c := range cs {
			out[i] = "together " + c
		}
		return out, nil
	}
	rs, err := Each(t.Context(), []string{"b1"}, key, alone, together)
	if err != nil || !slices.Equal(rs, []string{"alone b1"}) || sent != nil {
		t.Fatalf("one call: %q, %v (batch sent: %q)", rs, err, sent)
	}
	rs, err = Each(t.Context(), []string{"c1", "a1", "c2", "b1", "a2"}, key, alone, together)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a1", "a2", "b1", "c1", "c2"}; !slices.Equal(sent, want) {
		t.Errorf("sent %q, want %q", sent, want)
	}
	if want := []string{"together c1", "together a1", "together c2", "together b1", "together a2"}; !slices.Equal(rs, want) {
		t.Errorf("results %q, want %q", rs, want)
	}
}

// A batch the database refused (it rolled back) is sent again call by call, each getting
// its own outcome; one whose connection failed gives every call the error, sending
// nothing again (it may have committed).
func TestEachSendsAFailedBatchAgainOnlyIfItRolledBack(t *testing.T) {
	key := func(s string) string { return s }
	var alones []string
	alone := func(_ context.Context, s string) string { alones = append(alones, s); return "alone " + s }
	for _, tc := range []struct {
		err       error
		wantAlone []string
	}{
		{&pgconn.PgError{Code: "55P03"}, []string{"x", "y"}},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"}), []string{"x", "y"}},
		{errors.New("connection reset"), nil},
	} {
		alones = nil
		rs, err := Each(t.Context(), []string{"x", "y"}, key, alone,
			func(context.Context, []string) ([]string, error) { return nil, tc.err })
		if !slices.Equal(alones, tc.wantAlone) {
			t.Errorf("%v: sent alone %q, want %q", tc.err, alones, tc.wantAlone)
		}
		if tc.wantAlone != nil && (err != nil || !slices.Equal(rs, []string{"alone x", "alone y"})) {
			t.Errorf("%v: %q, %v; want each call's own outcome", tc.err, rs, err)
		}
		if tc.wantAlone == nil && !errors.Is(err, tc.err) {
			t.Errorf("%v: got %v, want the batch's error", tc.err, err)
		}
	}
	// Once the batch's context has ended, nothing is sent again.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	alones = nil
	if _, err := Each(ctx, []string{"x", "y"}, key, alone,
		func(context.Context, []string) ([]string, error) { return nil, &pgconn.PgError{Code: "57014"} }); err == nil || alones != nil {
		t.Errorf("cancelled batch: %v, sent alone %q", err, alones)
	}
}

// Positions places rows by their calls' positions, leaves the zero value for calls with
// no row, and refuses a position outside the batch.
func TestPositions(t *testing.T) {
	id := func(i int32) (int32, int32) { return i, i * 10 }
	rs, err := Positions(4, []int32{3, 1}, nil, id)
	if err != nil || !slices.Equal(rs, []int32{10, 0, 30, 0}) {
		t.Errorf("got %v, %v", rs, err)
	}
	for _, bad := range []int32{0, 5} {
		if _, err := Positions(4, []int32{bad}, nil, id); err == nil {
			t.Errorf("position %d of 4 accepted", bad)
		}
	}
	boom := errors.New("boom")
	if _, err := Positions(4, nil, boom, id); !errors.Is(err, boom) {
		t.Errorf("the query's error: got %v", err)
	}
}

// Call with anything but a pool (a transaction, a connection) sends the item alone, at
// once, never behind another call.
func TestCallOffAPoolGoesAlone(t *testing.T) {
	g := newGate()
	b := New(10, g.run)
	done := make(chan string)
	go func() {
		r, _ := b.Call(t.Context(), "a transaction", "", 1)
		done <- r
	}()
	<-g.arrived
	go func() {
		r, _ := b.Call(t.Context(), "a transaction", "", 2)
		done <- r
	}()
	<-g.arrived // the second went out while the first was in flight
	g.release <- nil
	g.release <- nil
	got := []string{<-done, <-done}
	slices.Sort(got)
	if !slices.Equal(got, []string{"r1", "r2"}) || len(g.batches) != 2 {
		t.Errorf("results %q in batches %v: want two batches of one", got, g.batches)
	}
}

// A caller gone before its batch answered it: the answer goes to the orphan function (to
// undo what nobody will use); an answered caller's result does not, nor does a failed
// batch's.
func TestAnAnswerNobodyWaitsForGoesToTheOrphanFunction(t *testing.T) {
	g := newGate()
	orphans := make(chan string, 10)
	b := New(10, g.run).Orphans(func(item int, r string) { orphans <- fmt.Sprint(item, " ", r) })
	out := make(chan result, 10)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	ctx1, cancel1 := context.WithCancel(context.Background())
	start(b, ctx1, "k", 1, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 1 })
	start(b, context.Background(), "k", 2, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 2 })
	g.release <- nil
	<-out       // call 0
	<-g.arrived // calls 1 and 2, in flight
	cancel1()
	if r := <-out; r.item != 1 || !errors.Is(r.err, ErrUnknown) {
		t.Fatalf("call gone in flight: %+v", r)
	}
	g.release <- nil // the batch answers both
	if r := <-out; r.item != 2 || r.err != nil {
		t.Fatalf("call 2: %+v", r)
	}
	select {
	case o := <-orphans:
		if o != "1 r1" {
			t.Errorf("orphan %q, want call 1's answer", o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gone call's answer did not reach the orphan function")
	}
	// A failed batch has nothing to undo.
	start(b, context.Background(), "k", 3, out)
	<-g.arrived
	ctx4, cancel4 := context.WithCancel(context.Background())
	start(b, ctx4, "k", 4, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 1 })
	start(b, context.Background(), "k", 5, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 2 })
	g.release <- nil
	<-out
	<-g.arrived
	cancel4()
	<-out
	g.release <- errors.New("boom")
	<-out
	until(t, "key idle", func() bool { return waitingBehind(b, "k") == -1 })
	select {
	case o := <-orphans:
		t.Errorf("orphan %q from a failed batch", o)
	default:
	}
}

// With two lanes, two calls of a key go out at once, each alone; the calls that come while
// both are in flight wait, and go out together when the first returns.
func TestLanesLetSeveralBatchesOfAKeyFly(t *testing.T) {
	g := newGate()
	b := New(10, g.run).Lanes(2)
	out := make(chan result, 10)
	start(b, context.Background(), "k", 0, out)
	<-g.arrived
	start(b, context.Background(), "k", 1, out)
	<-g.arrived // the second lane
	start(b, context.Background(), "k", 2, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 1 })
	start(b, context.Background(), "k", 3, out)
	until(t, "call queued", func() bool { return waitingBehind(b, "k") == 2 })
	g.release <- nil
	<-out
	<-g.arrived // 2 and 3, together
	g.release <- nil
	g.release <- nil
	for range 3 {
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		}
	}
	until(t, "key idle", func() bool { return waitingBehind(b, "k") == -1 })
	g.mu.Lock()
	defer g.mu.Unlock()
	if want := [][]int{{0}, {1}, {2, 3}}; fmt.Sprint(g.batches) != fmt.Sprint(want) {
		t.Errorf("batches %v, want %v", g.batches, want)
	}
}

// Found reads a statement that returns one row or none: no row is a call that found
// nothing (no error), an error is the call's own; Rows marks each call with a row as OK.
func TestOutcomes(t *testing.T) {
	if o := Found("row", nil); !o.OK || o.Row != "row" || o.Err != nil {
		t.Errorf("a row: %+v", o)
	}
	if o := Found("", fmt.Errorf("wrapped: %w", pgx.ErrNoRows)); o.OK || o.Err != nil {
		t.Errorf("no row: %+v", o)
	}
	boom := errors.New("boom")
	if o := Found("", boom); o.OK || !errors.Is(o.Err, boom) {
		t.Errorf("an error: %+v", o)
	}
	if o := Done[string](true, boom); o.OK || !errors.Is(o.Err, boom) {
		t.Errorf("done with an error: %+v", o)
	}
	os, err := Rows(3, []int32{2}, nil, func(i int32) (int32, string) { return i, fmt.Sprint("row ", i) })
	if err != nil || os[0].OK || !os[1].OK || os[1].Row != "row 2" || os[2].OK {
		t.Errorf("rows: %+v, %v", os, err)
	}
}
