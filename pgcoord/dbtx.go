package pgcoord

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is the handle taken by every call that runs a single statement. It is satisfied by
// *pgxpool.Pool, *pgx.Conn and pgx.Tx, so the caller chooses where the statement runs:
// pass a pgx.Tx to make the call part of your own transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
