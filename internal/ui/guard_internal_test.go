package ui

import (
	"fmt"
	"testing"
	"time"
)

// The login limiter's memory is bounded and never reset: past its size a new address
// evicts the one idle longest, and a locked-out address that keeps trying stays locked
// out however many other addresses come by.
func TestUILoginLimiterEvictsOneAtATime(t *testing.T) {
	t.Parallel()
	l := &loginLimiter{max: 100}
	now := time.Unix(1_000_000, 0)
	// An attacker spends its burst.
	for range loginBurst {
		if !l.allow("203.0.113.7", now) {
			t.Fatal("the burst was refused")
		}
	}
	if l.allow("203.0.113.7", now) {
		t.Fatal("an attempt past the burst was allowed")
	}
	// Ten times as many other addresses as the limiter holds, the attacker trying again
	// among them, within the same instant (nothing refills).
	for i := range 10 * l.max {
		if !l.allow(fmt.Sprintf("198.18.%d.%d", i/256, i%256), now) {
			t.Fatalf("a fresh address (%d) was refused", i)
		}
		if i%(l.max/2) == 0 && l.allow("203.0.113.7", now) {
			t.Fatalf("after %d other addresses the locked-out address got its burst back", i+1)
		}
		if n := l.tracked(); n > l.max {
			t.Fatalf("the limiter holds %d addresses, more than its %d", n, l.max)
		}
	}
}
