package ui

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/schedules"
)

type schedulesData struct {
	Rows        []schedules.Info
	After, Next string
	Prefix      string // filters the list (?prefix=)
}

// loadSchedules reads one page of schedules, filtered by name prefix: one query.
func loadSchedules(ctx context.Context, s *Server, q url.Values) (any, error) {
	var d schedulesData
	var err error
	if d.After, d.Prefix, err = pageParams(q); err != nil {
		return nil, err
	}
	all, err := schedules.List(ctx, s.cfg.Pool, &schedules.ListOpts{After: d.After, Prefix: d.Prefix, Limit: pageSize + 1})
	if err != nil {
		return nil, err
	}
	d.Rows, d.Next = pageOf(all, pageSize, func(i schedules.Info) string { return i.Name })
	return d, nil
}

// summarizeSchedules counts the schedules, the paused ones and those whose last run
// failed, from one bounded query.
func summarizeSchedules(ctx context.Context, s *Server) ([]count, error) {
	all, err := schedules.List(ctx, s.cfg.Pool, &schedules.ListOpts{Limit: summaryRows})
	if err != nil {
		return nil, err
	}
	more := len(all) == summaryRows
	var paused, failing int
	for _, i := range all {
		if i.Paused {
			paused++
		}
		if i.ConsecutiveFailures > 0 {
			failing++
		}
	}
	return []count{{"schedules", len(all), more}, {"paused", paused, more}, {"failing", failing, more}}, nil
}

// schedulePath is the path of a schedule's page.
func schedulePath(name string) string { return namePath("/schedules/", name) }

// namePath is the path of the page of the row name below base ("/schedules/"). The name is
// one escaped path segment (a "/" or "?" in it stays in it); a name of dots alone is
// escaped further, so that it is not read as "." or "..": Go's router then finds it, though
// a browser still cleans such a link away.
func namePath(base, name string) string {
	seg := url.PathEscape(name)
	if strings.Trim(seg, ".") == "" {
		seg = strings.ReplaceAll(seg, ".", "%2E")
	}
	return base + seg
}

// zoned formats t in the IANA zone, as the schedule's expression reads it; "-" for the
// zero time. A zone this binary does not know (a newer zone database wrote it) is said.
func zoned(t time.Time, zone string) string {
	if t.IsZero() {
		return "-"
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return "(zone unknown to this dashboard)"
	}
	return t.In(loc).Format("Mon 2006-01-02 15:04:05 MST")
}
