package integration_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/leases"
	"github.com/pgcoord/pgcoord/outbox"
)

// Every pgx query mode works, not only the default prepared statements: behind PgBouncer
// before 1.21 an application uses exec or simple_protocol, where pgx encodes arguments by
// their Go types alone — the JSON ones (lease metadata, message headers, stored responses)
// included.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			direct, schema := pgtest.Schema(t)
			pgtest.Migrate(t, direct, nil)
			url := pgtest.URL(t)
			sep := "?"
			if strings.Contains(url, "?") {
				sep = "&"
			}
			pool := pgtest.NewPool(t, url+sep+"default_query_exec_mode="+mode, schema)

			l, err := leases.TryAcquire(ctx, pool, "lease", time.Minute, &leases.AcquireOpts{Metadata: map[string]string{"region": "eu"}})
			if err != nil {
				t.Fatalf("leases.TryAcquire: %v", err)
			}
			if info, err := leases.Get(ctx, pool, "lease"); err != nil || info.Metadata["region"] != "eu" || info.Token != l.Token {
				t.Fatalf("leases.Get = %+v, %v", info, err)
			}

			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`{"a":1}`), JSON: true,
					Headers: map[string]string{"trace": "abc"}})
				return err
			})
			if err != nil {
				t.Fatalf("outbox.Enqueue: %v", err)
			}
			msgs, err := outbox.List(ctx, pool, nil)
			if err != nil || len(msgs) != 1 || msgs[0].Headers["trace"] != "abc" {
				t.Fatalf("outbox.List = %+v, %v", msgs, err)
			}

			fp := idempotency.Fingerprint("POST", "/x", nil, nil)
			a, err := idempotency.Begin(ctx, pool, "s", "k", fp, nil)
			if err != nil {
				t.Fatalf("idempotency.Begin: %v", err)
			}
			if err := a.Complete(ctx, idempotency.Response{Status: 201, Header: http.Header{"X-A": {"b"}}, Body: []byte("ok")}); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			a.Close(ctx)
			r, err := idempotency.Begin(ctx, pool, "s", "k", fp, nil)
			if err != nil || r.Replay() == nil || r.Replay().Header.Get("X-A") != "b" {
				t.Fatalf("replay = %+v, %v", r, err)
			}
			r.Close(ctx)
		})
	}
}
