package ui

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"time"

	"github.com/pgcoord/pgcoord/internal/doctor"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// doctorCache holds the latest findings of `pgcoord doctor`'s checks.
type doctorCache struct {
	mu       sync.Mutex
	at       time.Time
	findings []doctor.Finding
}

// get returns the doctor's findings, at most Config.DoctorEvery old, and when they were made.
func (c *doctorCache) get(ctx context.Context, s *Server) ([]doctor.Finding, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < s.cfg.DoctorEvery {
		return c.findings, c.at, nil
	}
	f, err := doctor.Run(ctx, s.cfg.Pool, doctor.Options{MaxStaleness: s.cfg.MaxStaleness})
	if err != nil { // only when ctx ended: keep the old findings
		return nil, time.Time{}, err
	}
	c.findings, c.at = f, time.Now()
	return c.findings, c.at, nil
}

type overviewData struct {
	Schema    pgcoord.SchemaStatus
	SchemaErr string
	Pending   int
	// Findings are the checks of `pgcoord doctor`, CheckedAgo how long ago they ran;
	// Attention counts those that need attention.
	Findings    []doctor.Finding
	Attention   int
	CheckedAgo  string
	DoctorEvery string
	Summaries   []summary
}

// loadOverview reads the schema's state (two queries), each primitive's summary (one
// bounded query each) and the doctor's findings (cached for Config.DoctorEvery).
func loadOverview(ctx context.Context, s *Server, _ url.Values) (any, error) {
	var d overviewData
	st, err := pgcoord.CheckSchema(ctx, s.cfg.Pool)
	d.Schema, d.Pending = st, len(st.Pending())
	if err != nil && !errors.Is(err, pgcoord.ErrSchemaOutdated) {
		d.SchemaErr = err.Error()
	}
	findings, at, err := s.doctor.get(ctx, s)
	if err != nil {
		return nil, err
	}
	d.Findings, d.CheckedAgo, d.DoctorEvery = findings, humanDuration(time.Since(at)), humanDuration(s.cfg.DoctorEvery)
	for _, f := range findings {
		if f.Status == doctor.Attention {
			d.Attention++
		}
	}
	for _, p := range s.pages {
		if p.summarize == nil {
			continue
		}
		sum := summary{Name: p.title, Path: p.path}
		if sum.Counts, err = p.summarize(ctx, s); err != nil {
			sum.Counts, sum.Err = nil, err.Error()
		}
		d.Summaries = append(d.Summaries, sum)
	}
	return d, nil
}
