package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func ExampleMiddleware() {
	ctx := context.Background()
	pool := pgtest.ExamplePool() // your *pgxpool.Pool, with pgcoord migrated
	pool.Exec(ctx, `CREATE TABLE orders (id serial PRIMARY KEY, item text)`)

	// The handler writes with the key's transaction: the order and the stored response
	// commit together.
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int
		tx := idempotency.Tx(r.Context())
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ('book') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, id)
	})
	mw, err := idempotency.Middleware(pool, &idempotency.Config{
		Atomic: true,
		// Keys are unique per scope: scope them by the authenticated client, so two
		// clients that pick the same key never share a response.
		Scope: func(r *http.Request) (string, error) { return "account:" + r.Header.Get("Account"), nil },
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw(createOrder))
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Account", "acme") // what your authentication establishes
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b))
	}
	post("a1", `{"item":"book"}`)
	post("a1", `{"item":"book"}`) // a retry: replayed, no second order
	post("a1", `{"item":"pen"}`)  // the key reused for another request: refused
	var orders int
	pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// 201  {"order":1}
	// 201 true {"order":1}
	// 422  {"detail":"this idempotency key was used for a different request","status":422,"title":"Idempotency key reused","type":"about:blank"}
	// orders: 1
}

func ExampleBegin() {
	ctx := context.Background()
	pool := pgtest.ExamplePool()

	// A payment job, without HTTP: the key is the order id; the fingerprint says what the
	// job is asked to do.
	charge := func(order string, cents int) string {
		fp := idempotency.Fingerprint("charge", order, []byte(fmt.Sprint(cents)), nil)
		a, err := idempotency.Begin(ctx, pool, "payments", order, fp, nil)
		if err != nil {
			return err.Error()
		}
		defer a.Close(ctx)
		if r := a.Replay(); r != nil {
			return "already done: " + string(r.Body)
		}
		// Call the provider with a key derived from ours: a retry sends the same one.
		providerKey := a.DerivedKey("charge")
		_ = providerKey
		if err := a.Complete(ctx, idempotency.Response{Status: 200, Body: []byte("charged " + fmt.Sprint(cents))}); err != nil {
			return err.Error()
		}
		return "charged"
	}
	fmt.Println(charge("order-42", 1000))
	fmt.Println(charge("order-42", 1000))
	fmt.Println(charge("order-42", 2000))
	// Output:
	// charged
	// already done: charged 1000
	// idempotency: key reused for a different request
}

func ExampleDerivedKey() {
	// The same (scope, key, step) always derives the same key, in every process.
	fmt.Println(idempotency.DerivedKey("payments", "order-42", "charge"))
	// Output:
	// f0aa8ec26ad9f3a9f0471a712a1cfd615378cce2bead90d151173d1b6e29482f
}
