package pgconfig

import (
	"context"
	"errors"
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
func withStatementTimeout(cfg *pgx.ConnConfig, d time.Duration) {
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return &cancelHandler{conn: c} }
	cfg.Tracer = timeoutTracer{d: d}
}

// errStatementTimeout is the cause of a statement's context that ended at its timeout.
var errStatementTimeout = errors.New("pgconfig: statement timeout")

// cancelHandler cancels a statement that ran past its timeout with a cancel request, and
// closes the connection only if the server has not answered within cancelGrace. A context
// that ended for another reason (the program is stopping) interrupts the connection at once,
// as pgx does by default: a cancel request would not interrupt a connection waiting for a
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

type cancelKey struct{}

func (t timeoutTracer) start(ctx context.Context) context.Context {
	ctx, cancel := context.WithTimeoutCause(ctx, t.d, errStatementTimeout)
	return context.WithValue(ctx, cancelKey{}, cancel)
}

func (timeoutTracer) end(ctx context.Context) {
	if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

func (t timeoutTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return t.start(ctx)
}

func (t timeoutTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.start(ctx)
}

func (timeoutTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t timeoutTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return t.start(ctx)
}

func (t timeoutTracer) TraceCopyFromEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromEndData) {
	t.end(ctx)
}
