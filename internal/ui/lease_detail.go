package ui

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/pgcoord/pgcoord/leases"
)

// auditRows bounds the operator actions a detail shows.
const auditRows = 10

// leaseDetail is one lease with what belongs to it: its newest grant (the only one the
// database keeps), the fence register of the same name, who waits for it and what
// operators did to it.
type leaseDetail struct {
	Name    string
	Info    *leaseRow // nil: never granted, or collected
	Missing string
	// Register is the fence register named like the lease (fenced.Check's resource), if
	// any: the highest token a fenced write was accepted with, and when. Floor is the
	// highest token of every collected register and lease.
	Register       *fenceRegister
	Floor          int64
	WantedUntil    time.Time // a blocking Acquire waits for the lease until then (zero: none)
	Job            string    // the job whose runs fence with this register ("job:" + name), if any
	Audit          []auditRow
	AuditRows      int
	DBNow          time.Time
	RegisterBehind bool // the register's token is below the grant's: the holder has not written yet
}

type fenceRegister struct {
	Token     int64
	UpdatedAt time.Time
}

type auditRow struct {
	ID    int64
	At    time.Time
	Actor string
	// SessionRole is the database role the recording session logged in as: the actor is
	// claimed, the session role is set by the database ("" for rows older than it).
	SessionRole string
	Action      string
	Details     string
}

// loadLeaseDetail reads a lease (leases.Get), its fence register and waiters (one
// query) and the operator actions on it (one query on the audit log, newest first).
func loadLeaseDetail(ctx context.Context, s *Server, name string) (*leaseDetail, error) {
	d := &leaseDetail{Name: name, AuditRows: auditRows}
	i, err := leases.Get(ctx, s.cfg.Pool, name)
	switch {
	case errors.Is(err, leases.ErrNotFound):
		d.Missing = "no lease of that name: never granted, or collected"
	case err != nil:
		return nil, err
	default:
		r := leaseRowOf(i)
		d.Info = &r
	}
	var regToken *int64
	var regAt, wanted *time.Time
	err = s.cfg.Pool.QueryRow(ctx, `
		SELECT f.fence_token, f.updated_at, (SELECT fl.fence_token FROM pgcoord_fence_floor fl),
		       (SELECT l.wanted_until FROM pgcoord_leases l WHERE l.name = $1 AND l.wanted_until > pgcoord_now()),
		       pgcoord_now()
		  FROM (SELECT 1) one LEFT JOIN pgcoord_fences f ON f.resource = $1`, name).
		Scan(&regToken, &regAt, &d.Floor, &wanted, &d.DBNow)
	if err != nil {
		return nil, err
	}
	if regToken != nil {
		d.Register = &fenceRegister{Token: *regToken, UpdatedAt: *regAt}
		if d.Info != nil {
			d.RegisterBehind = *regToken < d.Info.Token
		}
	}
	if wanted != nil {
		d.WantedUntil = *wanted
	}
	if job, ok := strings.CutPrefix(name, "job:"); ok { // the resource a job's runs fence with
		d.Job = job
	}
	if d.Audit, err = auditOf(ctx, s, name); err != nil {
		return nil, err
	}
	if d.Job != "" { // the register a job's runs fence with is known while the job is
		jobs, _, err := listJobs(ctx, s, d.Job, "", 1)
		if err != nil {
			return nil, err
		}
		if len(jobs) == 0 || jobs[0].Name != d.Job {
			d.Job = ""
		}
	}
	if d.Info == nil && d.Register == nil && wanted == nil && len(d.Audit) == 0 && d.Job == "" {
		// Nothing of that name: a link's text is not shown back (it could say anything).
		d.Name, d.Job, d.Missing = "", "", "no lease, fence register or operator action of that name"
	}
	return d, nil
}

// auditOf reads the newest operator actions on target (at most auditRows).
func auditOf(ctx context.Context, s *Server, target string) ([]auditRow, error) {
	rows, err := s.cfg.Pool.Query(ctx, `
		SELECT a.id, a.at, a.actor, a.session_role, a.action, a.details::text FROM pgcoord_audit a
		 WHERE a.target = $1 ORDER BY a.id DESC LIMIT $2`, target, auditRows)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var a auditRow
		if err := rows.Scan(&a.ID, &a.At, &a.Actor, &a.SessionRole, &a.Action, &a.Details); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
