package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/listen"
	"github.com/pgcoord/pgcoord/internal/tracing"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// Limits and defaults.
const (
	// MaxPartitions is the most partitions a group has.
	MaxPartitions = 65536
	// MaxGroupLen is the longest group name, in bytes (a partition's fence resource,
	// "<group>#<partition>", must fit a name's 255).
	MaxGroupLen = 200
	// MaxWeight is the largest member weight.
	MaxWeight = 1000
	// DefaultTTL is a member's lease when Options.TTL is zero: a member that stops
	// heartbeating for that long loses its partitions to the others.
	DefaultTTL = 15 * time.Second
	// MinTTL bounds Options.TTL from below (heartbeats go every third of it).
	MinTTL = time.Second
)

var (
	check   = base.Check("partition")
	queries dbsqlc.Queries

	// ErrRevoked means a partition's grant is not current any more (it was revoked, it
	// expired, or the partition was granted again): write nothing more for it.
	ErrRevoked = errors.New("partition: the grant is not current: the partition moved on")
	// ErrUnknownGroup means the group does not exist: Join it with Options.Partitions to
	// create it.
	ErrUnknownGroup = errors.New("partition: no such group")
	// ErrLeft is Member.Check's error once Leave was called.
	ErrLeft = errors.New("partition: the member left its group")
)

// Options configure Join. A nil *Options means the defaults, and the group must exist.
type Options struct {
	// Partitions, if not zero, creates the group with this many partitions (1 to
	// MaxPartitions) when it does not exist; a group of another size is refused (resize it
	// on purpose, with Resize). Zero: the group must exist (ErrUnknownGroup).
	Partitions int
	// Member identifies this member in the group. Default: a new identity per Join,
	// "host/pid/random". A member that joins again under the same name while its old
	// lease lasts takes its place (and its partitions).
	Member string
	// Weight is the member's share of the partitions relative to the others' (1 to
	// MaxWeight). Default 1.
	Weight int
	// TTL is the member's lease, renewed every third of it: a member that stops for TTL
	// loses its partitions to the others. Default DefaultTTL; MinTTL to 24 hours.
	TTL time.Duration
	// OnAssign is called, from the member's goroutine, for each partition granted to it:
	// start its work under p.Context, and return quickly.
	OnAssign func(p Partition)
	// OnRevoke is called, in a goroutine of its own, for each partition that leaves the
	// member, after p.Context was cancelled: when the plan moved it (the partition is
	// released to its next owner when OnRevoke returns, or after RevokeGrace), when its
	// grant was lost (it expired: nothing to release), and at Leave. Wait here for the
	// partition's work to stop.
	OnRevoke func(ctx context.Context, p Partition)
	// RevokeGrace bounds OnRevoke: its context ends then, and the partition is released
	// whether it returned or not. Default TTL/3.
	RevokeGrace time.Duration
	// Logger receives failed heartbeats. Default slog.Default().
	Logger *slog.Logger
	// Tracer, if set, traces each heartbeat (see pgcoord.Tracer).
	Tracer pgcoord.Tracer
}

// Partition is a partition granted to a member.
type Partition struct {
	Group string
	ID    int
	// Token is the grant's fence token: higher than every earlier grant's of the partition.
	Token int64
	// Context is cancelled when the partition leaves the member (revoked, lost, or Leave),
	// and, by the local clock, when the grant may have expired because heartbeats failed
	// or did not answer in time.
	Context context.Context
}

// Resource is the partition's fence resource, "<group>#<id>": fenced.Check(ctx, tx,
// p.Resource(), p.Token) refuses the token from the partition's next grant on, even before
// the next owner writes.
func (p Partition) Resource() string { return p.Group + "#" + strconv.Itoa(p.ID) }

// Member is a member of a partition group, from Join to Leave.
type Member struct {
	pool      *pgxpool.Pool
	group, id string
	o         Options
	ctx       context.Context // cancelled at Leave: the partitions' contexts are its children
	stop      context.CancelFunc
	quit      chan struct{}   // closed by Leave: the heartbeat loop ends after its current heartbeat
	wake      chan struct{}   // a revoke finished: release at once
	syncs     chan chan error // Sync's requests: heartbeat at once, and answer
	done      chan struct{}   // the heartbeat loop returned
	leaveOnce sync.Once
	leaveErr  error

	mu         sync.Mutex
	owned      map[int]*grant
	release    []int32     // revoked partitions whose OnRevoke returned, to release
	partitions int         // the group's size at the last heartbeat
	deadline   time.Time   // when the grants may expire, by the local clock
	lapseAt    *time.Timer // gives the grants up at deadline, whatever heartbeat is under way
	wakeAt     time.Time   // when something may change without a notification
}

// answerWithin is how long a heartbeat (or a read of the grants) may take, in TTLs, before
// the member gives up on it and tries again on another connection. Not one TTL: a call ended
// by its context closes its connection, and on a server short of CPU the next call, on a
// new connection whose backend must compile the functions and plan their statements again
// (ten times a warm call's work), took longer still: every heartbeat of every member then
// timed out, for minutes, and the group granted nothing. A late answer still keeps its
// connection warm and its work done; the grants lapse at their deadline meanwhile.
const answerWithin = 3

type grant struct {
	p        Partition
	cancel   context.CancelFunc
	revoking bool
}

// Join joins group as a member and returns once its first heartbeat was answered: the
// member is in the plan, and any free partition the plan gives it is granted (OnAssign
// has run for it). It heartbeats until Leave. An unknown group is ErrUnknownGroup; bad
// options are refused before any SQL runs (pgcoord.ErrInvalidArgument, ErrInvalidName).
func Join(ctx context.Context, pool *pgxpool.Pool, group string, opts *Options) (*Member, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := validate(pool, group, &o); err != nil {
		return nil, err
	}
	if o.Partitions > 0 {
		if _, err := queries.PartitionCreate(ctx, pool, dbsqlc.PartitionCreateParams{GroupName: group, Partitions: int32(o.Partitions)}); err != nil {
			return nil, fmt.Errorf("partition: create %q: %w", group, translate(err))
		}
	}
	w, err := waiter(ctx, pool, group)
	if err != nil {
		return nil, err
	}
	mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m := &Member{pool: pool, group: group, id: o.Member, o: o, ctx: mctx, stop: stop, quit: make(chan struct{}),
		wake: make(chan struct{}, 1), syncs: make(chan chan error), done: make(chan struct{}), owned: map[int]*grant{}}
	if err := m.beat(ctx, true); err != nil {
		stop()
		w.Close()
		return nil, err
	}
	go m.run(w)
	return m, nil
}

func validate(pool *pgxpool.Pool, group string, o *Options) error {
	if err := checkGroup(pool, group); err != nil {
		return err
	}
	if o.Partitions < 0 || o.Partitions > MaxPartitions {
		return check.Invalid("Partitions %d is outside [1, %d] (0: the group exists)", o.Partitions, MaxPartitions)
	}
	if o.Member == "" {
		o.Member = base.NewHolderID()
	}
	if err := check.Name("member", o.Member); err != nil {
		return err
	}
	if o.Weight == 0 {
		o.Weight = 1
	}
	if o.Weight < 1 || o.Weight > MaxWeight {
		return check.Invalid("Weight %d is outside [1, %d]", o.Weight, MaxWeight)
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < MinTTL || o.TTL > 24*time.Hour {
		return check.Invalid("TTL %v is outside [%v, 24h]", o.TTL, MinTTL)
	}
	if o.RevokeGrace == 0 {
		o.RevokeGrace = o.TTL / 3
	}
	if o.RevokeGrace < 0 || o.RevokeGrace > o.TTL {
		return check.Invalid("RevokeGrace %v is outside (0, TTL]", o.RevokeGrace)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// waiter returns a waiter for the group's notifications, or one that only sleeps behind a
// transaction pooler.
func waiter(ctx context.Context, pool *pgxpool.Pool, group string) (*listen.Waiter, error) {
	if listen.Pooled(pool) {
		return listen.New(ctx, pool, "", "")
	}
	ch, err := queries.PartitionChannel(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("partition: %w", base.TranslateError(err))
	}
	w, err := listen.New(ctx, pool, ch, listen.Tag(group))
	if err != nil {
		// On a standby LISTEN is refused: pgcoord.ErrReadOnly, as the heartbeat would be.
		return nil, fmt.Errorf("partition: listen: %w", base.TranslateError(err))
	}
	return w, nil
}

// translate maps the database's refusals to the package's errors.
func translate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "P0002":
			return fmt.Errorf("%w: %w", ErrUnknownGroup, err)
		case "22023", "22004":
			return fmt.Errorf("%w: %w", pgcoord.ErrInvalidArgument, err)
		}
	}
	return base.TranslateError(err)
}

// Name is the member's name in the group.
func (m *Member) Name() string { return m.id }

// Partitions is the group's partition count as of the member's last heartbeat: the n of
// KeyPartition(key, n).
func (m *Member) Partitions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.partitions
}

// Owned returns the partitions the member holds and has not been asked to release, in
// order.
func (m *Member) Owned() []Partition {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ps []Partition
	for _, g := range m.owned {
		if !g.revoking && g.p.Context.Err() == nil {
			ps = append(ps, g.p)
		}
	}
	slices.SortFunc(ps, func(a, b Partition) int { return a.ID - b.ID })
	return ps
}

// Check verifies, inside tx, that p's grant is current (the member holds it under p.Token,
// by the database clock), and holds it until tx ends: no other grant of the partition can
// be made meanwhile, so tx's writes are made while this member owns the partition. It
// returns ErrRevoked when the grant is not current: roll tx back. Keep such transactions
// short: the partition's next grant waits for them (the group's other partitions, plans
// and renewals do not).
func (m *Member) Check(ctx context.Context, tx pgx.Tx, p Partition) error {
	if err := check.DB(tx); err != nil {
		return err
	}
	if m.left() {
		return ErrLeft
	}
	if p.Group != m.group || p.ID < 0 || p.ID >= MaxPartitions || p.Token < 1 {
		return check.Invalid("partition %d of %q with token %d is not one of this member's group %q", p.ID, p.Group, p.Token, m.group)
	}
	rows, err := queries.PartitionCheck(ctx, tx, dbsqlc.PartitionCheckParams{
		GroupName: m.group, Partition: int32(p.ID), Member: m.id, FenceToken: p.Token,
	})
	if err != nil {
		return fmt.Errorf("partition: check %s: %w", p.Resource(), translate(err))
	}
	if len(rows) == 0 {
		return fmt.Errorf("%w (%s, token %d)", ErrRevoked, p.Resource(), p.Token)
	}
	return nil
}

// Leave cancels the contexts of the member's partitions, waits for their OnRevoke
// (each bounded by RevokeGrace), then releases them and leaves the group in one call:
// the plan gives its partitions to the others at once. If ctx ends before every OnRevoke
// returned, Leave returns ctx's error without releasing anything: the member has stopped
// heartbeating, and its partitions move when its lease expires. Calls after the first
// return the first's result.
func (m *Member) Leave(ctx context.Context) error {
	m.leaveOnce.Do(func() {
		// A heartbeat under way is let finish, not cancelled: a cancelled one may still run
		// in the database, after the leave, and join the member again.
		close(m.quit)
		<-m.done
		m.stop()
		m.mu.Lock()
		var gs []*grant
		for _, g := range m.owned {
			if !g.revoking {
				gs = append(gs, g)
			}
		}
		m.owned = map[int]*grant{}
		m.mu.Unlock()
		var wg sync.WaitGroup
		for _, g := range gs {
			g.cancel()
			wg.Go(func() { m.onRevoke(g.p) })
		}
		revoked := make(chan struct{})
		go func() {
			wg.Wait()
			close(revoked)
		}()
		select {
		case <-revoked:
		case <-ctx.Done():
			m.leaveErr = fmt.Errorf("partition: leave %q: %w before OnRevoke returned; the member's partitions move when its lease expires",
				m.group, ctx.Err())
			return
		}
		if _, err := queries.PartitionLeave(ctx, m.pool, dbsqlc.PartitionLeaveParams{GroupName: m.group, Member: m.id}); err != nil {
			m.leaveErr = fmt.Errorf("partition: leave %q: %w", m.group, translate(err))
		}
	})
	return m.leaveErr
}

// onRevoke runs OnRevoke for p, bounded by RevokeGrace.
func (m *Member) onRevoke(p Partition) {
	if m.o.OnRevoke == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.o.RevokeGrace)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.o.OnRevoke(ctx, p)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		m.o.Logger.Warn("partition: OnRevoke did not return within RevokeGrace; releasing the partition",
			"group", m.group, "partition", p.ID, "grace", m.o.RevokeGrace)
	}
}

// run heartbeats until Leave: every third of the TTL, at once when a revoked partition is
// ready to be released, and when something may change without a notification (another
// member's lease or a grant it waits for expires). A notification about the group makes
// it read its grants (look), and heartbeat only when the read asks for one.
func (m *Member) run(w *listen.Waiter) {
	defer close(m.done)
	defer w.Close()
	last := time.Now()
	failed := false // the last heartbeat failed: retry after a tenth of the TTL, not at once
	for {
		m.mu.Lock()
		next := last.Add(m.o.TTL / 3)
		if !failed && !m.wakeAt.IsZero() && m.wakeAt.Before(next) {
			next = m.wakeAt
			if next.Before(last) {
				// What it waits for had already expired at the last heartbeat, which could
				// not grant it (a transaction holds the partition): try again a little
				// later, not in a loop.
				next = last.Add(m.o.TTL / 30)
			}
		}
		if !failed && len(m.release) > 0 {
			next = time.Now()
		}
		deadline := m.deadline
		m.mu.Unlock()
		if !deadline.IsZero() && deadline.Before(next) {
			next = deadline
		}
		synced, err := m.sleep(w, time.Until(next))
		if err != nil {
			return
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			m.lapse(deadline)
		}
		if synced == nil && time.Now().Before(next) && !m.releasing() && m.look() {
			// Woken early by a notification: a read showed all that changed.
			continue
		}
		bctx, cancel := context.WithTimeout(m.ctx, answerWithin*m.o.TTL)
		err = m.beat(bctx, false)
		cancel()
		if synced != nil {
			synced <- err
		}
		if err != nil {
			if m.left() {
				return
			}
			m.o.Logger.Warn("partition: heartbeat failed; retrying", "group", m.group, "member", m.id, "err", err)
			last = time.Now().Add(-m.o.TTL / 3).Add(m.o.TTL / 10) // retry in a tenth of the TTL
			failed = true
			continue
		}
		last, failed = time.Now(), false
	}
}

// releasing says whether revoked partitions wait for a heartbeat to release them.
func (m *Member) releasing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.release) > 0
}

// look reads the member's grants, without a write, and applies them when that is all
// there is to do: the call that freed a partition granted it to the member the plan gives
// it to, so a member woken by a notification learns of its new partitions (and of those
// to release) from a read. It says false, for a heartbeat, when the read failed, the
// member is not live, or a partition planned for it is still free.
func (m *Member) look() bool {
	ctx, cancel := context.WithTimeout(m.ctx, answerWithin*m.o.TTL)
	defer cancel()
	conn, sent, err := m.acquire(ctx)
	if err != nil {
		return false
	}
	r, err := queries.PartitionOwned(ctx, conn, dbsqlc.PartitionOwnedParams{GroupName: m.group, Member: m.id})
	conn.Release()
	if err != nil || !r.Live || r.Pending > 0 {
		return false
	}
	m.apply(dbsqlc.PartitionHeartbeatRow{
		Owned: r.Owned, Tokens: r.Tokens, Revoke: r.Revoke, ExpiresAt: r.ExpiresAt,
		Partitions: r.Partitions, Epoch: r.Epoch, WakeAt: r.WakeAt, DbNow: r.DbNow,
	}, sent, nil)
	return true
}

// left says whether Leave asked the heartbeat loop to end.
func (m *Member) left() bool {
	select {
	case <-m.quit:
		return true
	default:
		return false
	}
}

// sleep waits d, or for a notification about the group, a finished revoke or a Sync (whose
// answer channel it returns); ErrLeft once Leave was called.
func (m *Member) sleep(w *listen.Waiter, d time.Duration) (synced chan error, err error) {
	if m.left() {
		return nil, ErrLeft
	}
	if d <= 0 {
		return nil, nil
	}
	wctx, cancel := context.WithCancel(m.ctx)
	woken := make(chan struct{})
	go func() {
		defer close(woken)
		select {
		case <-m.wake:
		case <-m.quit:
		case synced = <-m.syncs:
		case <-wctx.Done():
		}
		cancel()
	}()
	err = w.Wait(wctx, d)
	cancel()
	<-woken
	if m.left() {
		if synced != nil {
			synced <- ErrLeft
		}
		return nil, ErrLeft
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		if synced != nil {
			synced <- err
		}
		return nil, err
	}
	return synced, nil
}

// Sync heartbeats at once, rather than at the next third of the TTL, and returns when the
// answer is applied (OnAssign has run for the partitions it granted): for a caller that
// learned that the member's grants are not what Owned says (the database refused one).
// It returns the heartbeat's error, ErrLeft after Leave, or ctx's error.
func (m *Member) Sync(ctx context.Context) error {
	answer := make(chan error, 1)
	select {
	case m.syncs <- answer:
	case <-m.quit:
		return ErrLeft
	case <-m.done:
		return ErrLeft
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lapse gives up every grant whose heartbeat did not come back in time: by the local clock
// they may have expired, and another member may hold them. It does nothing if a heartbeat
// answered since the deadline was set (the grants' deadline is not deadline any more).
func (m *Member) lapse(deadline time.Time) {
	m.mu.Lock()
	if !m.deadline.Equal(deadline) {
		m.mu.Unlock()
		return
	}
	lost := m.owned
	m.owned = map[int]*grant{}
	m.release = nil
	m.deadline = time.Time{}
	m.mu.Unlock()
	for _, g := range lost {
		g.cancel()
		if !g.revoking {
			go m.onRevoke(g.p)
		}
	}
}

// acquire returns a connection of the member's pool and the instant it was handed over,
// which a grant's deadline counts from: the database reads its clock after that (a
// deadline from then is still early enough), and not counting the wait for a connection —
// a new one on a busy server took longer than a one-second TTL — leaves the grants their
// time.
func (m *Member) acquire(ctx context.Context) (*pgxpool.Conn, time.Time, error) {
	conn, err := m.pool.Acquire(ctx)
	return conn, time.Now(), err
}

// beat sends one heartbeat, releasing the revoked partitions whose OnRevoke returned, and
// applies its answer.
func (m *Member) beat(ctx context.Context, joining bool) (err error) {
	m.mu.Lock()
	release := slices.Clone(m.release)
	m.mu.Unlock()
	if release == nil {
		release = []int32{}
	}
	var span tracing.Span
	if m.o.Tracer != nil {
		ctx, span = tracing.Start(ctx, m.o.Tracer, tracing.PartHeartbeat,
			tracing.Str(tracing.AttrGroup, m.group), tracing.Str(tracing.AttrHolder, m.id))
		defer func() { span.End(err) }()
	}
	conn, sent, err := m.acquire(ctx)
	if err != nil {
		return fmt.Errorf("partition: heartbeat of %q in %q: %w", m.id, m.group, translate(err))
	}
	r, err := queries.PartitionHeartbeat(ctx, conn, dbsqlc.PartitionHeartbeatParams{
		GroupName: m.group, Member: m.id, Weight: int32(m.o.Weight), Ttl: dbarg.Interval(m.o.TTL),
		Release: release, Joining: joining,
	})
	conn.Release() // before OnAssign runs, which may want a connection of the same pool
	if err != nil {
		return fmt.Errorf("partition: heartbeat of %q in %q: %w", m.id, m.group, translate(err))
	}
	granted, revoked := m.apply(r, sent, release)
	if span.On() {
		span.Set(tracing.Int(tracing.AttrOwned, int64(len(r.Owned))), tracing.Int(tracing.AttrGranted, int64(granted)),
			tracing.Int(tracing.AttrRevoked, int64(revoked)))
	}
	return nil
}

// apply brings the member's partitions to what a heartbeat answered (sent at sent, by the
// local clock, releasing released): new grants are assigned, grants gone are lost, and
// grants to release are revoked. It says how many it assigned and revoked.
func (m *Member) apply(r dbsqlc.PartitionHeartbeatRow, sent time.Time, released []int32) (assigned, revoked int) {
	held := make(map[int]int64, len(r.Owned))
	for i, p := range r.Owned {
		held[int(p)] = r.Tokens[i]
	}
	m.mu.Lock()
	m.partitions = int(r.Partitions)
	m.deadline = sent.Add(r.ExpiresAt.Sub(r.DbNow))
	// (sent is before the database's now: a few milliseconds later, the expiry has passed
	// by the database clock too.) The grants lapse then, even while a heartbeat is under
	// way; an answer that came too late lapses them at once, before any is assigned.
	if m.lapseAt != nil {
		m.lapseAt.Stop()
	}
	deadline := m.deadline
	if !time.Now().Before(deadline) {
		m.mu.Unlock()
		m.lapse(deadline)
		return 0, 0
	}
	m.lapseAt = time.AfterFunc(time.Until(deadline), func() { m.lapse(deadline) })
	m.wakeAt = sent.Add(r.WakeAt.Sub(r.DbNow)).Add(10 * time.Millisecond)
	m.release = slices.DeleteFunc(m.release, func(p int32) bool { return slices.Contains(released, p) })
	var lost, added, revoke []*grant
	for id, g := range m.owned {
		if tok, ok := held[id]; !ok || tok != g.p.Token {
			if g.revoking && slices.Contains(released, int32(id)) || !g.revoking {
				delete(m.owned, id)
				if !g.revoking {
					lost = append(lost, g)
				}
			}
		}
	}
	for id, tok := range held {
		if _, ok := m.owned[id]; ok || slices.Contains(released, int32(id)) {
			continue
		}
		ctx, cancel := context.WithCancel(m.ctx) // run cancels it at the deadline (lapse) if heartbeats fail
		g := &grant{p: Partition{Group: m.group, ID: id, Token: tok, Context: ctx}, cancel: cancel}
		m.owned[id] = g
		added = append(added, g)
	}
	for _, id := range r.Revoke {
		if g := m.owned[int(id)]; g != nil && !g.revoking {
			g.revoking = true
			revoke = append(revoke, g)
		}
	}
	m.mu.Unlock()

	for _, g := range lost {
		g.cancel()
		go m.onRevoke(g.p)
	}
	slices.SortFunc(added, func(a, b *grant) int { return a.p.ID - b.p.ID })
	for _, g := range added {
		if m.o.OnAssign != nil && g.p.Context.Err() == nil {
			m.o.OnAssign(g.p)
		}
	}
	for _, g := range revoke {
		g.cancel()
		go func() {
			m.onRevoke(g.p)
			m.mu.Lock()
			m.release = append(m.release, int32(g.p.ID))
			m.mu.Unlock()
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}()
	}
	return len(added), len(revoke)
}
