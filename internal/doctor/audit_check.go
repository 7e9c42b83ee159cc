package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// auditTriggers are the triggers of migration 9 that keep pgcoord_audit append-only for
// every role but its owner, and stamp each entry with the session's login role.
var auditTriggers = []string{"pgcoord_audit_append_only", "pgcoord_audit_stamp"}

// checkAudit reports weak grants on the audit log: a role other than the table's owner (or
// a member of it), or PUBLIC, holding UPDATE, DELETE, TRUNCATE or TRIGGER on pgcoord_audit
// (UPDATE also on one of its columns), and a trigger of migration 9 missing or disabled.
func checkAudit(ctx context.Context, pool *pgxpool.Pool, _ Options) Finding {
	var owner string
	var weak []string
	var revokeFrom []string
	rows, err := pool.Query(ctx, `
		WITH t AS (SELECT c.oid, c.relowner, c.relacl FROM pg_class c WHERE c.oid = to_regclass('pgcoord_audit')),
		grants AS (
			SELECT a.grantee, a.privilege_type AS priv FROM t, aclexplode(t.relacl) a
			 WHERE a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER')
			UNION
			SELECT a.grantee, 'UPDATE (' || quote_ident(at.attname) || ')' FROM t
			  JOIN pg_attribute at ON at.attrelid = t.oid AND at.attnum > 0 AND NOT at.attisdropped,
			       aclexplode(at.attacl) a
			 WHERE a.privilege_type = 'UPDATE')
		SELECT t.relowner::regrole::text,
		       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
		       string_agg(g.priv, ', ' ORDER BY g.priv)
		  FROM t LEFT JOIN grants g
		    ON CASE WHEN g.grantee = 0 THEN true
		            ELSE g.grantee <> t.relowner AND NOT pg_has_role(g.grantee, t.relowner, 'MEMBER') END
		 GROUP BY 1, 2 ORDER BY 2`)
	if err != nil {
		return failed(err)
	}
	defer rows.Close()
	for rows.Next() {
		var grantee, privs *string
		if err := rows.Scan(&owner, &grantee, &privs); err != nil {
			return failed(err)
		}
		if grantee != nil && privs != nil {
			weak = append(weak, fmt.Sprintf("%s (%s)", *grantee, *privs))
			revokeFrom = append(revokeFrom, *grantee)
		}
	}
	if err := rows.Err(); err != nil {
		return failed(err)
	}
	if owner == "" {
		return Finding{Status: Attention, Summary: "pgcoord_audit does not exist",
			Explain: "The audit log of operator actions is missing from the schema: apply pgcoord's migrations (pgcoord migrate up)."}
	}

	var problems, explain []string
	if len(weak) > 0 {
		problems = append(problems, "roles other than its owner "+owner+" may rewrite or erase the audit log: "+list(weak))
		explain = append(explain, "UPDATE, DELETE and TRUNCATE on pgcoord_audit belong to its owner alone: the trigger "+
			"pgcoord_audit_append_only refuses them to everyone else, but the grant says otherwise, and TRIGGER lets a role add a "+
			"trigger that rewrites new entries. Revoke them, as the owner: REVOKE UPDATE, DELETE, TRUNCATE, TRIGGER ON pgcoord_audit FROM "+
			strings.Join(revokeFrom, ", ")+" (and, for a column grant, REVOKE UPDATE (column) ON pgcoord_audit FROM ...). "+
			"docs/security.md gives the application role SELECT and INSERT on the audit log only.")
	}
	var states []*string
	for range auditTriggers {
		states = append(states, new(string))
	}
	err = pool.QueryRow(ctx, `
		SELECT coalesce((SELECT tg.tgenabled::text FROM pg_trigger tg
		                  WHERE tg.tgrelid = to_regclass('pgcoord_audit') AND tg.tgname = $1
		                    AND tg.tgfoid = to_regprocedure('pgcoord_audit_guard()')), ''),
		       coalesce((SELECT tg.tgenabled::text FROM pg_trigger tg
		                  WHERE tg.tgrelid = to_regclass('pgcoord_audit') AND tg.tgname = $2
		                    AND tg.tgfoid = to_regprocedure('pgcoord_audit_guard()')), '')`,
		auditTriggers[0], auditTriggers[1]).Scan(states[0], states[1])
	if err != nil {
		return failed(err)
	}
	var broken []string
	for i, name := range auditTriggers {
		switch *states[i] {
		case "O", "A": // fires (A: also in replica sessions)
		case "":
			broken = append(broken, "trigger "+name+" is missing")
		default: // D: disabled; R: fires only in replica sessions
			broken = append(broken, "trigger "+name+" is disabled")
		}
	}
	if len(broken) > 0 {
		problems = append(problems, strings.Join(broken, ", "))
		explain = append(explain, "Without pgcoord_audit_append_only any role with UPDATE, DELETE or TRUNCATE on the audit log "+
			"can rewrite or erase it; without pgcoord_audit_stamp an entry records whatever login role its INSERT claims. "+
			"As the owner: ALTER TABLE pgcoord_audit ENABLE TRIGGER pgcoord_audit_append_only (and pgcoord_audit_stamp); "+
			"if a trigger is missing, roll back migration 9 and apply it again (pgcoord migrate down --to 8, then up).")
	}
	if len(problems) == 0 {
		return Finding{Status: OK, Summary: "the audit log is append-only: only its owner " + owner + " may update, delete or truncate it"}
	}
	return Finding{Status: Attention, Summary: strings.Join(problems, "; "), Explain: strings.Join(explain, " ")}
}
