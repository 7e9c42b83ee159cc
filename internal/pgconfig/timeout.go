package pgconfig

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// cancelGrace is how long a connection waits for the server to answer the cancel request of
// a statement past its timeout before it is closed as broken.
const cancelGrace = 5 * time.Second

// withStatementTimeout bounds every statement the pool's connections send (queries, batches,
// COPY, BEGIN and COMMIT included) to d: a statement still running after d is cancelled
// with a cancel request, which the server answers with SQLSTATE 57014 and which the
// connection survives. A statement_timeout startup parameter would do the same on the server,
// but transaction-mode poolers (PgBouncer) refuse that parameter, and a session-level SET
// would not follow the statements across the pooler's server connections; a cancel request
// reaches the statement through any pooler.
//
// A statement that may commit — one sent outside a transaction block, which commits on its
// own, or a COMMIT — gets no answer from its cancel request: its connection is closed at the
// timeout, so the caller gets an error and must treat the outcome as unknown. A commit
// waiting for a synchronous standby that is cancelled commits locally and reports success
// with only a warning ("canceling wait for synchronous replication"): answering it would
// acknowledge a grant that a failover can lose. pgconn still sends the cancel request as it
// closes the connection, so the statement's work stops on the server.
func withStatementTimeout(cfg *pgx.ConnConfig, d time.Duration) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return &cancelHandler{conn: c} }
	cfg.Tracer = timeoutTracer{d: d}
}

// errStatementTimeout is the cause of a statement's context that ended at its timeout.
var errStatementTimeout = errors.New("pgconfig: statement timeout")

// IsStatementTimeout reports whether err is a statement's failure at the pool's statement
// timeout, and whether its outcome is unknown: a statement that may have committed (see
// Options.StatementTimeout) rather than one the server cancelled (SQLSTATE 57014). It
// cannot tell the statement timeout from the end of a context of the caller's, which the
// caller checks first.
func IsStatementTimeout(err error) (timedOut, unknown bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57014", false
	}
	if pgconn.Timeout(err) {
		return true, true
	}
	return false, false
}

// cancelHandler cancels a statement that ran past its timeout with a cancel request, and
// closes the connection only if the server has not answered within cancelGrace; a statement
// that may commit it does not let answer (see withStatementTimeout). A context that ended
// for another reason (the program is stopping) interrupts the connection at once, as pgx
// does by default: a cancel request would not interrupt a connection waiting for a
// notification, which the server does not answer.
//
// Unlike pgconn.CancelRequestContextWatcherHandler it lets the cancel request finish even
// when the statement ends first: closing a cancel connection before PgBouncer 1.18 has
// forwarded it crashes PgBouncer ("bad client state"). Waiting for it also keeps a late
// cancel from hitting the connection's next statement.
type cancelHandler struct {
	conn *pgconn.PgConn
	sent chan struct{}
}

func (h *cancelHandler) HandleCancel(ctx context.Context) {
	if !errors.Is(context.Cause(ctx), errStatementTimeout) {
		h.sent = nil
		_ = h.conn.Conn().SetDeadline(time.Now())
		return
	}
	if mayCommit, _ := ctx.Value(mayCommitKey{}).(bool); mayCommit {
		// The read fails at once, and pgconn closes the connection: it sends a cancel request
		// before it closes the socket, so the statement stops on the server too.
		h.sent = nil
		_ = h.conn.Conn().SetDeadline(time.Now())
		return
	}
	h.sent = make(chan struct{})
	_ = h.conn.Conn().SetDeadline(time.Now().Add(cancelGrace))
	go func() {
		defer close(h.sent)
		ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
		defer cancel()
		_ = h.conn.CancelRequest(ctx)
	}()
}

func (h *cancelHandler) HandleUnwatchAfterCancel() {
	if h.sent != nil {
		<-h.sent
	}
	_ = h.conn.Conn().SetDeadline(time.Time{})
}

// timeoutTracer gives each statement a context that ends d after it starts, and ends it
// when the statement is done.
type timeoutTracer struct{ d time.Duration }

type (
	cancelKey    struct{}
	mayCommitKey struct{}
)

// start gives a statement its timeout, and notes whether it may commit: sent outside a
// transaction block (status idle: it commits on its own, or it begins a transaction that
// a pipelined COMMIT may end), or a COMMIT.
func (t timeoutTracer) start(ctx context.Context, conn *pgx.Conn, sqls ...string) context.Context {
	mayCommit := conn.PgConn().TxStatus() != 'T'
	for _, sql := range sqls {
		mayCommit = mayCommit || isCommit(sql)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, t.d, errStatementTimeout)
	ctx = context.WithValue(ctx, mayCommitKey{}, mayCommit)
	return context.WithValue(ctx, cancelKey{}, cancel)
}

// isCommit reports whether sql ends a transaction with a commit (COMMIT, END, COMMIT
// PREPARED).
func isCommit(sql string) bool {
	word, _, _ := strings.Cut(strings.TrimSpace(sql), " ")
	word = strings.TrimRight(word, ";")
	return strings.EqualFold(word, "commit") || strings.EqualFold(word, "end")
}

func (timeoutTracer) end(ctx context.Context) {
	if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

func (t timeoutTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return t.start(ctx, conn, data.SQL)
}

func (t timeoutTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	var sqls []string
	if data.Batch != nil {
		for _, q := range data.Batch.QueuedQueries {
			sqls = append(sqls, q.SQL)
		}
	}
	return t.start(ctx, conn, sqls...)
}

func (timeoutTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t timeoutTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return t.start(ctx, conn)
}

func (t timeoutTracer) TraceCopyFromEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromEndData) {
	t.end(ctx)
}
