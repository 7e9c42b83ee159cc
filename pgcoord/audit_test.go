package pgcoord_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcoord/pgcoord/internal/ui/audit"
	"github.com/pgcoord/pgcoord/pgcoord"
)

// The audit log cannot be erased, rewritten or forged by the application role, even when a
// careless operator granted it UPDATE, DELETE and TRUNCATE on the table (as the grants
// block of docs/security.md once did): it records the role the session logged in as
// whatever --actor (or the INSERT) claims, and only the owner can prune it.
func TestAuditAppendOnlyForTheApplicationRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lp := newLeastPrivilege(t)
	owner, app, appRole := lp.owner, lp.app, lp.appRole
	if _, err := owner.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON pgcoord_audit TO `+appRole); err != nil {
		t.Fatal(err)
	}

	// Forging: the actor is claimed, the session role is not.
	e, err := audit.Record(ctx, app, audit.Entry{Actor: "someone", Action: "lease.expire", Target: "orders:42"})
	if err != nil {
		t.Fatalf("Record as the application role: %v", err)
	}
	if e.Actor != "someone" || e.SessionRole != appRole {
		t.Errorf("recorded actor %q, session role %q; want someone, %s", e.Actor, e.SessionRole, appRole)
	}
	var ownerRole string
	if err := owner.QueryRow(ctx, `SELECT session_user`).Scan(&ownerRole); err != nil {
		t.Fatal(err)
	}
	var forgedRole string
	var forgedAt time.Time
	err = app.QueryRow(ctx, `
		INSERT INTO pgcoord_audit (actor, action, target, session_role, at)
		VALUES ('someone', 'lease.expire', 'orders:43', $1, '2000-01-01T00:00:00Z') RETURNING session_role, at`, ownerRole).
		Scan(&forgedRole, &forgedAt)
	if err != nil {
		t.Fatal(err)
	}
	if forgedRole != appRole || forgedAt.Year() < 2001 {
		t.Errorf("an INSERT claiming session role %s at 2000-01-01 recorded %q at %v; want %s, now", ownerRole, forgedRole, forgedAt, appRole)
	}

	// Erasing and rewriting: refused whatever was granted, and nothing changed.
	for _, sql := range []string{
		`DELETE FROM pgcoord_audit`,
		`DELETE FROM pgcoord_audit WHERE false`,
		`UPDATE pgcoord_audit SET actor = 'nobody'`,
		`UPDATE pgcoord_audit SET session_role = '` + ownerRole + `'`,
		`TRUNCATE pgcoord_audit`,
		`INSERT INTO pgcoord_audit (id, actor, action, target) OVERRIDING SYSTEM VALUE
		 VALUES (` + strconv.FormatInt(e.ID, 10) + `, 'x', 'x', 'x') ON CONFLICT (id) DO UPDATE SET actor = 'nobody'`,
	} {
		_, err := app.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "append-only") {
			t.Errorf("as the application role: %s = %v; want SQLSTATE 42501, append-only", sql, err)
		}
	}
	var n int
	var actor, role string
	if err := owner.QueryRow(ctx, `SELECT count(*), min(actor), min(session_role) FROM pgcoord_audit`).Scan(&n, &actor, &role); err != nil {
		t.Fatal(err)
	}
	if n != 2 || actor != "someone" || role != appRole {
		t.Fatalf("after the refused statements: %d rows, actor %q, role %q; want the 2 rows as written", n, actor, role)
	}

	// pgcoord's own collection runs as the application role and leaves the log alone.
	if _, err := pgcoord.GC(ctx, app, nil); err != nil {
		t.Fatalf("pgcoord.GC as the application role: %v", err)
	}
	// The owner prunes.
	tag, err := owner.Exec(ctx, `DELETE FROM pgcoord_audit WHERE id = $1`, e.ID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the owner's DELETE = %v, %v; want 1 row deleted", tag, err)
	}
}
