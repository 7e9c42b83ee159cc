// Package txhandle begins transactions whose BEGIN rides in one round trip with their first
// statements, and still hands out a pgx.Tx for them.
//
// pgx makes a pgx.Tx only for a BEGIN it sends itself, in a round trip of its own. But a
// pgx.Tx's methods only pass statements to its connection, whatever the server's
// transaction state; only its Commit and Rollback close it. So a pgx.Tx that pgx began on a
// connection, never committed or rolled back through its own methods, serves every later
// transaction of that connection: Begin keeps the first one and reuses it. The transaction
// is then ended by COMMIT or ROLLBACK sent on the connection (alone or in a batch), and the
// pgx.Tx is handed to other code only wrapped by Owned.
package txhandle

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Begin sends BEGIN and b's statements on c and returns a pgx.Tx for the transaction they
// open and the results of b's statements (BEGIN's are read). On a connection that has had a
// transaction from Begin before, that is one round trip; on the others pgx sends BEGIN
// first, a round trip of its own. Close the results before using c again, and end the
// transaction with COMMIT or ROLLBACK on c, never through the pgx.Tx.
func Begin(ctx context.Context, c *pgx.Conn, b *pgx.Batch) (pgx.Tx, pgx.BatchResults, error) {
	if tx := kept(c); tx != nil {
		all := &pgx.Batch{}
		all.Queue("BEGIN")
		all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
		br := c.SendBatch(ctx, all)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, nil, err
		}
		return tx, br, nil
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	keep(c, tx)
	return tx, c.SendBatch(ctx, b), nil
}

// Owned returns tx for code that must not end the transaction: its Commit and Rollback do
// nothing and return err. Its other methods, Begin (a savepoint) included, are tx's.
func Owned(tx pgx.Tx, err error) pgx.Tx { return owned{tx, err} }

type owned struct {
	pgx.Tx
	err error
}

func (o owned) Commit(context.Context) error   { return o.err }
func (o owned) Rollback(context.Context) error { return o.err }

// dataKey is the key of the kept pgx.Tx in its connection's custom data: it lives and dies
// with the connection, and only the goroutine using the connection reads or writes it.
const dataKey = "github.com/pgcoord/pgcoord/internal/txhandle"

// kept returns the pgx.Tx kept for c, or nil.
func kept(c *pgx.Conn) pgx.Tx {
	tx, _ := c.PgConn().CustomData()[dataKey].(pgx.Tx)
	return tx
}

// keep keeps tx, begun by pgx on c, for c's later transactions.
func keep(c *pgx.Conn, tx pgx.Tx) { c.PgConn().CustomData()[dataKey] = tx }
