// Package tracing is how the primitives report spans to a pgcoord.Tracer: the names of
// the operations, events and attributes (listed in docs/observability.md), and Span, a
// span that may be absent.
//
// A call without a Tracer must pay only a nil check, so callers build attributes only on
// the traced path: a variadic argument escapes to the heap even when it is not used. The
// pattern is
//
//	var span tracing.Span
//	if o.Tracer != nil {
//		ctx, span = tracing.Start(ctx, o.Tracer, tracing.LeaseAcquire, tracing.Str(tracing.AttrLease, name))
//		defer func() { span.End(err) }()
//	}
//	...
//	if span.On() {
//		span.Set(tracing.Int(tracing.AttrToken, token))
//	}
package tracing

import (
	"context"

	"github.com/pgcoord/pgcoord/pgcoord"
)

// The operations (span names).
const (
	LeaseAcquire    = "pgcoord.lease.acquire"
	LeaseTryAcquire = "pgcoord.lease.try_acquire"
	LeaseRenew      = "pgcoord.lease.renew"
	LeaseDo         = "pgcoord.lease.do"
	SemAcquire      = "pgcoord.semaphore.acquire"
	SemTryAcquire   = "pgcoord.semaphore.try_acquire"
	TickClaim       = "pgcoord.tick.claim"
	TickRun         = "pgcoord.tick.run"
	IdemBegin       = "pgcoord.idempotency.begin"
	OutboxEnqueue   = "pgcoord.outbox.enqueue"
	OutboxDeliver   = "pgcoord.outbox.deliver"
	RateTake        = "pgcoord.ratelimit.take"
	PartHeartbeat   = "pgcoord.partition.heartbeat"
	EventWait       = "pgcoord.wait"                // an attempt was refused: the call waits
	EventLeaseLost  = "pgcoord.lease.lost"          // Do's lease was lost while fn ran
	EventTickLost   = "pgcoord.tick.lost"           // RunTick's run was lost while fn ran
	EventIdemReplay = "pgcoord.idempotency.replay"  // Begin found the stored response
	AttrLease       = "pgcoord.lease.name"          // string
	AttrHolder      = "pgcoord.holder"              // string
	AttrToken       = "pgcoord.token"               // int64: the fence token granted
	AttrAttempts    = "pgcoord.attempts"            // int64: attempts a waiting call made
	AttrHeldBy      = "pgcoord.held_by"             // string: the holder a waiting call waits for
	AttrKey         = "pgcoord.semaphore.key"       // string
	AttrLimit       = "pgcoord.semaphore.limit"     // int64
	AttrJob         = "pgcoord.job.name"            // string
	AttrTick        = "pgcoord.job.tick"            // string, RFC 3339
	AttrAttempt     = "pgcoord.attempt"             // int64: which attempt of a tick, key or message
	AttrClaimed     = "pgcoord.job.claimed"         // bool
	AttrScope       = "pgcoord.idempotency.scope"   // string
	AttrIdemKey     = "pgcoord.idempotency.key"     // string
	AttrOutcome     = "pgcoord.idempotency.outcome" // string: first, recovery, replay, in_flight, mismatch, expired
	AttrStatus      = "pgcoord.idempotency.status"  // int64: the replayed response's status
	AttrTopic       = "pgcoord.outbox.topic"        // string
	AttrMsgKey      = "pgcoord.outbox.key"          // string
	AttrMsgID       = "pgcoord.outbox.id"           // int64
	AttrCause       = "pgcoord.cause"               // string: why a lease or run was lost
	AttrRatePolicy  = "pgcoord.ratelimit.policy"    // string: the first limit's policy
	AttrRateKey     = "pgcoord.ratelimit.key"       // string: the first limit's key
	AttrRateCost    = "pgcoord.ratelimit.cost"      // int64: the units asked
	AttrGroup       = "pgcoord.partition.group"     // string
	AttrOwned       = "pgcoord.partition.owned"     // int64: partitions the member holds after the call
	AttrGranted     = "pgcoord.partition.granted"   // int64: partitions the call granted
	AttrRevoked     = "pgcoord.partition.revoked"   // int64: partitions the call asked the member to release
)

// Span is a pgcoord.Span that may be absent: the zero Span (a call without a Tracer)
// does nothing.
type Span struct{ s pgcoord.Span }

// Start starts the span op with t, which must not be nil.
func Start(ctx context.Context, t pgcoord.Tracer, op string, attrs ...pgcoord.Attr) (context.Context, Span) {
	ctx, s := t.Start(ctx, op, attrs...)
	return ctx, Span{s}
}

// On reports whether the span exists (its call has a Tracer): build attributes only then.
func (s Span) On() bool { return s.s != nil }

// End ends the span, recording err if not nil.
func (s Span) End(err error) {
	if s.s != nil {
		s.s.End(err)
	}
}

// Set adds attributes; call it only when On.
func (s Span) Set(attrs ...pgcoord.Attr) { s.s.SetAttrs(attrs...) }

// Event records an event; call it only when On.
func (s Span) Event(name string, attrs ...pgcoord.Attr) { s.s.AddEvent(name, attrs...) }

// Str, Int and Bool make attributes.
func Str(k, v string) pgcoord.Attr       { return pgcoord.Attr{Key: k, Value: v} }
func Int(k string, v int64) pgcoord.Attr { return pgcoord.Attr{Key: k, Value: v} }
func Bool(k string, v bool) pgcoord.Attr { return pgcoord.Attr{Key: k, Value: v} }
