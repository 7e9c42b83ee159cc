package gocronpg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/singleton"
)

// LockerConfig configures a Locker. Window is required.
type LockerConfig struct {
	// Window is the length of a tick slot by the database clock: one Lock call per job and
	// slot succeeds. It must be at most the shortest interval of the jobs using the Locker
	// (ideally equal to it, and dividing the others), longer than twice the splay between
	// the replicas' calls for one tick, and a whole number of microseconds. See the
	// package documentation.
	Window time.Duration
	// Origin aligns the slots: they start at Origin + k*Window. Default: the Unix epoch
	// minus Window/2, which centres the slots on the multiples of Window.
	Origin time.Time
	// TTL is the lease of a run while its job runs, heartbeated every TTL/3: a replica
	// that dies mid-run blocks the job (its next ticks are skipped) for at most TTL.
	// Default singleton.DefaultTTL (30s).
	TTL time.Duration
	// Holder identifies this replica in the ledger. Default: a new "host/pid/random" identity.
	Holder string
	// Prefix is prepended to gocron's lock key (the job's name) to form the ledger's job
	// name, to keep the jobs of several schedulers apart. Default "".
	Prefix string
	// Logger receives lost runs and failed heartbeats and finishes. Default slog.Default().
	Logger *slog.Logger
}

// Locker is a gocron.Locker that lets one replica run each tick of a job, by claiming the
// tick in package singleton's ledger (Job{Name: Prefix+key, Every: Window, Origin,
// Overlap: OverlapForbid, TTL}). Create it with NewLocker; it is safe for concurrent use
// by any number of schedulers and jobs.
type Locker struct {
	pool *pgxpool.Pool
	cfg  LockerConfig
	log  *slog.Logger

	mu   sync.Mutex
	held map[string]*Lock // the latest lock of each ledger job name
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker on pool. It returns an error wrapping
// pgcoord.ErrInvalidArgument for a nil pool or config, a missing or invalid Window, or a
// TTL out of range, and one wrapping pgcoord.ErrInvalidName for a bad Holder. It runs no
// SQL.
func NewLocker(pool *pgxpool.Pool, cfg *LockerConfig) (*Locker, error) {
	if pool == nil {
		return nil, check.Invalid("nil pool")
	}
	if cfg == nil {
		return nil, check.Invalid("nil locker config")
	}
	c := *cfg
	if c.Window <= 0 || c.Window > singleton.MaxEvery || c.Window%time.Microsecond != 0 {
		return nil, check.Invalid("Window %v must be positive, at most %v and a whole number of microseconds", c.Window, singleton.MaxEvery)
	}
	if c.Origin.IsZero() {
		c.Origin = time.Unix(0, 0).UTC().Add(-c.Window / 2).Truncate(time.Microsecond)
	}
	if c.TTL == 0 {
		c.TTL = singleton.DefaultTTL
	}
	if c.TTL < 3*time.Millisecond || c.TTL > singleton.MaxTTL {
		return nil, check.Invalid("TTL %v is outside %v..%v", c.TTL, 3*time.Millisecond, singleton.MaxTTL)
	}
	if c.Holder == "" {
		c.Holder = base.NewHolderID()
	} else if err := check.Name("holder", c.Holder); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Locker{pool: pool, cfg: c, log: c.Logger.With("holder", c.Holder), held: map[string]*Lock{}}, nil
}

// Holder returns the replica's identity in the ledger.
func (l *Locker) Holder() string { return l.cfg.Holder }

// Job returns the ledger job that Lock claims for key (gocron's job name).
func (l *Locker) Job(key string) singleton.Job {
	return singleton.Job{
		Name: l.cfg.Prefix + key, Every: l.cfg.Window, Origin: l.cfg.Origin,
		Overlap: singleton.OverlapForbid, TTL: l.cfg.TTL,
	}
}

// Lock claims the current tick of the job key (gocron passes the job's name) in one round
// trip. It returns a *Lock if this replica is to run the tick, and otherwise an error: one
// wrapping singleton.ErrNoTick if the tick already ran or is running on another replica,
// or was skipped because the previous run is still running; the database's error if it
// cannot be reached. gocron skips the job on this replica on any error (and passes it to
// a gocron.AfterLockError listener). The run is heartbeated until Unlock.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	job := l.Job(key)
	start := time.Now()
	run, err := singleton.ClaimTick(ctx, l.pool, job, &singleton.ClaimOpts{Holder: l.cfg.Holder})
	if err != nil {
		return nil, fmt.Errorf("gocronpg: lock %q: %w", key, err)
	}
	k := &Lock{
		locker: l, job: job, run: run, trustUntil: start.Add(job.TTL - job.TTL/10),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.mu.Lock()
	l.held[job.Name] = k
	l.mu.Unlock()
	go k.heartbeat()
	return k, nil
}

// Current returns the run this Locker holds for key while the job runs, for the job to
// fence its writes with run.Token (package fenced, resource "job:"+name): false once the
// run was unlocked, lost, or could not be heartbeated for most of its TTL.
func (l *Locker) Current(key string) (singleton.Run, bool) {
	l.mu.Lock()
	k := l.held[l.cfg.Prefix+key]
	l.mu.Unlock()
	if k == nil {
		return singleton.Run{}, false
	}
	return k.current()
}

// Lock is one tick claimed by a Locker: the gocron.Lock that gocron releases when the job
// returns.
type Lock struct {
	locker *Locker
	job    singleton.Job
	stop   chan struct{}
	done   chan struct{}

	mu         sync.Mutex
	run        singleton.Run
	trustUntil time.Time // local: no heartbeat can be relied on after this
	lost       error

	once      sync.Once
	unlockErr error
}

var _ gocron.Lock = (*Lock)(nil)

// Run returns the claimed run as last heartbeated: its tick (ScheduledFor, the start of
// the slot), fence token and lease.
func (k *Lock) Run() singleton.Run {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.run
}

func (k *Lock) current() (singleton.Run, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lost != nil || !time.Now().Before(k.trustUntil) {
		return singleton.Run{}, false
	}
	return k.run, true
}

// heartbeat extends the run's lease every TTL/3 until Unlock, and gives up when the run is
// lost.
func (k *Lock) heartbeat() {
	defer close(k.done)
	ttl := k.job.TTL
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	log := k.locker.log.With("job", k.job.Name, "token", k.Run().Token)
	for {
		select {
		case <-k.stop:
			return
		case <-timer.C:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), ttl/3)
		next, err := singleton.HeartbeatTick(ctx, k.locker.pool, k.Run(), ttl)
		cancel()
		switch {
		case errors.Is(err, singleton.ErrLost):
			k.mu.Lock()
			k.lost = err
			k.mu.Unlock()
			log.Warn("pgcoord: gocron job run lost; the job keeps running (fence its writes)", "err", err)
			return
		case err != nil:
			log.Warn("pgcoord: gocron job heartbeat failed; retrying", "err", err)
			timer.Reset(max(ttl/10, time.Millisecond))
			continue
		}
		k.mu.Lock()
		k.run, k.trustUntil = next, start.Add(ttl-ttl/10)
		k.mu.Unlock()
		timer.Reset(ttl / 3)
	}
}

// Unlock stops the heartbeats and records the run as succeeded in the ledger (gocron does
// not tell a Locker whether the job failed). It returns an error wrapping singleton.ErrLost
// if the run was no longer current (taken over after its lease expired), or the
// database's error. Only the first call acts; later calls return its result. The record
// is written even if ctx is already cancelled (gocron passes the job's context, cancelled
// at shutdown), bounded by 5s.
func (k *Lock) Unlock(ctx context.Context) error {
	k.once.Do(func() {
		close(k.stop)
		<-k.done
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		run := k.Run()
		if err := singleton.FinishTick(fctx, k.locker.pool, run, nil); err != nil {
			k.unlockErr = fmt.Errorf("gocronpg: unlock %q: %w", k.job.Name, err)
			k.locker.log.Warn("pgcoord: recording a gocron job run failed", "job", k.job.Name, "token", run.Token, "err", err)
		}
		k.mu.Lock()
		if k.lost == nil {
			k.lost = errors.New("gocronpg: unlocked")
		}
		k.mu.Unlock()
		k.locker.mu.Lock()
		if k.locker.held[k.job.Name] == k {
			delete(k.locker.held, k.job.Name)
		}
		k.locker.mu.Unlock()
	})
	return k.unlockErr
}
