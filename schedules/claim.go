package schedules

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/base"
	"github.com/pgcoord/pgcoord/internal/cronspec"
	"github.com/pgcoord/pgcoord/internal/dbarg"
	"github.com/pgcoord/pgcoord/internal/dbsqlc"
	"github.com/pgcoord/pgcoord/internal/tracing"
)

// dueClaim is one schedule's due ticks, ready to claim.
type dueClaim struct {
	name    string
	version int64
	from    time.Time
	missed  int64
	ticks   []time.Time
	next    *time.Time
}

// prepare computes the ticks a due schedule's claim sends; false when there is nothing to
// claim (a stored expression this binary cannot parse is logged).
func (s *Scheduler) prepare(d dbsqlc.ScheduleDueRow) (dueClaim, bool) {
	spec, err := cronspec.Parse(d.Expr, d.Zone, anchorTime(dbarg.Deref(d.StartsAt)))
	if err != nil {
		s.cfg.Logger.Error("schedules: cannot claim a schedule", "schedule", d.Name, "err", err)
		return dueClaim{}, false
	}
	missed, ticks, next := dueTicks(spec, d.NextAt, d.DbNow.Add(-dbarg.Duration(d.CatchUp)), d.DbNow,
		CatchUpPolicy(d.CatchUpPolicy), d.EndsAt)
	return dueClaim{name: d.Name, version: d.Version, from: d.NextAt, missed: missed, ticks: ticks, next: next},
		missed > 0 || len(ticks) > 0
}

// claimDue claims the due ticks of the schedules of one look (at most batch), as many as
// this process has places for, in one statement and one commit
// (pgcoord_schedule_claim_many), launches the runs it got and says how many. A claim skips
// a schedule another process is claiming, so processes never queue behind each other's
// claims.
func (s *Scheduler) claimDue(ctx context.Context, due []dbsqlc.ScheduleDueRow) (int, error) {
	var claims []dueClaim
	for _, d := range due {
		if !s.reserve() {
			break
		}
		c, ok := s.prepare(d)
		if !ok {
			s.release()
			continue
		}
		claims = append(claims, c)
	}
	switch len(claims) {
	case 0:
		return 0, nil
	case 1:
		return s.claimOne(ctx, claims[0])
	}
	sent := time.Now()
	rows, err := s.claimMany(ctx, claims)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The database refused one claim's arguments, and with it the statement: claim
		// each alone, so that only that one fails.
		n := 0
		for _, c := range claims {
			k, err := s.claimOne(ctx, c)
			if err != nil {
				s.warn(ctx, "claim a due tick", err)
			}
			n += k
		}
		return n, nil
	}
	launched, n := make([]bool, len(claims)), 0
	for _, r := range rows {
		if i, ok := started(claims, r); ok && !launched[i] {
			launched[i] = true
			n++
			s.launch(ctx, claimed(dbsqlc.ScheduleStartRow(r)), sent)
		}
	}
	for _, ok := range launched {
		if !ok {
			s.release()
		}
	}
	if err != nil {
		return n, fmt.Errorf("claim %d due schedules: %w", len(claims), base.TranslateError(err))
	}
	return n, nil
}

// claimMany sends the claims in one statement, each traced as a claim of its own.
func (s *Scheduler) claimMany(ctx context.Context, claims []dueClaim) ([]dbsqlc.ScheduleClaimManyRow, error) {
	p := dbsqlc.ScheduleClaimManyParams{Holder: s.cfg.Holder, Handlers: s.handlers, Ttl: dbarg.Interval(s.cfg.RunTTL)}
	spans := make([]tracing.Span, len(claims))
	for i, c := range claims {
		p.Names = append(p.Names, c.name)
		p.Versions = append(p.Versions, c.version)
		p.Froms = append(p.Froms, c.from)
		p.Missed = append(p.Missed, c.missed)
		p.Firsts = append(p.Firsts, int32(len(p.Ticks)+1))
		p.Counts = append(p.Counts, int32(len(c.ticks)))
		p.Ticks = append(p.Ticks, c.ticks...)
		p.HasNext = append(p.HasNext, c.next != nil)
		p.Nexts = append(p.Nexts, dbarg.Deref(c.next))
		_, spans[i] = s.claimSpan(ctx, c.name)
	}
	rows, err := queries.ScheduleClaimMany(ctx, s.cfg.Pool, p)
	ran := make([]bool, len(claims))
	for _, r := range rows {
		if i, ok := started(claims, r); ok {
			ran[i] = true
		}
	}
	for i, span := range spans {
		endClaim(span, ran[i], err)
	}
	return rows, err
}

// started says which claim a row of a batch claim started a run for, if it did.
func started(claims []dueClaim, r dbsqlc.ScheduleClaimManyRow) (int, bool) {
	if r.State != "running" {
		return 0, false
	}
	i := slices.IndexFunc(claims, func(c dueClaim) bool { return c.name == r.Job })
	return i, i >= 0
}

// claimOne claims one schedule's due ticks, with a place reserved; the place goes to the
// run it starts, if any. It says how many runs it started.
func (s *Scheduler) claimOne(ctx context.Context, c dueClaim) (int, error) {
	sent := time.Now()
	cctx, span := s.claimSpan(ctx, c.name)
	rows, err := queries.ScheduleClaim(cctx, s.cfg.Pool, dbsqlc.ScheduleClaimParams{
		Name: c.name, Version: c.version, FromTick: c.from, Missed: c.missed, Ticks: c.ticks, Next: c.next,
		Holder: s.cfg.Holder, Handlers: s.handlers, Ttl: dbarg.Interval(s.cfg.RunTTL),
	})
	endClaim(span, err == nil && len(rows) > 0 && rows[0].State == "running", err)
	if err != nil || len(rows) == 0 || rows[0].State != "running" {
		s.release()
		if err != nil {
			return 0, fmt.Errorf("claim %q: %w", c.name, base.TranslateError(err))
		}
		return 0, nil
	}
	s.launch(ctx, claimed(dbsqlc.ScheduleStartRow(rows[0])), sent)
	return 1, nil
}
