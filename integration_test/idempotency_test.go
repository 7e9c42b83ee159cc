//go:build unix

package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcoord/pgcoord/idempotency"
	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// Idempotency keys across a crash. A worker process serves HTTP on loopback behind the
// idempotency middleware; its handler makes an effect and then hangs, and the test SIGKILLs
// the process in the middle of the request. A second worker process serves the client's
// retry: the dead holder stops renewing its lease, so the key is recovered once the lease
// lapses (the workers' Lease is idemLease; until then the retry gets 409, which a client
// retries) — and the effect still happens once.
//
// Two handlers:
//
//   - "phases" (not Atomic): an effect outside the key's transaction (a charge at a
//     provider, here a row committed on its own in idem_charges), then a recovery point
//     "charged" with the charge id. The retry resumes from it: it does not charge again,
//     and answers with the first attempt's charge.
//   - "atomic": the handler's own write (an order) through the key's transaction. The
//     killed attempt's write rolls back with it; the retry executes and writes once.

const idemRole = "idempotency.server"

// idemLease is the workers' idempotency.Config.Lease: a killed worker's key is taken over
// at most this long after its last renewal, well within the retry loop's pgtest.WaitLimit.
const idemLease = 2 * time.Second

// idemScope is the scope of the workers' keys: the clients are one principal.
const idemScope = "http"

func init() { workerRoles[idemRole] = idempotencyServer }

const idemSchema = `
CREATE TABLE idem_charges (id serial PRIMARY KEY, key text NOT NULL, provider_key text NOT NULL, pid int NOT NULL);
CREATE TABLE idem_orders (id serial PRIMARY KEY, key text NOT NULL, pid int NOT NULL);
`

// idempotencyServer serves POST /pay behind the middleware until killed. Parameters:
// MODE ("phases" or "atomic") and HANG ("1": after its effect the handler says so on
// stdout and never answers).
//
// It says "listening <url>" once it serves, and "charged <id>" / "ordered <id>" when the
// handler made its effect.
func idempotencyServer(ctx context.Context, w *workerproc.Worker) error {
	mode, hang := w.Param("MODE"), w.Param("HANG") == "1"
	pool := w.Pool
	handler := func(rw http.ResponseWriter, r *http.Request) {
		a := idempotency.FromContext(r.Context())
		var result map[string]any
		switch mode {
		case "phases":
			point, data := a.RecoveryPoint()
			charge := string(data)
			if point != "charged" {
				var id int
				if err := pool.QueryRow(r.Context(), `INSERT INTO idem_charges (key, provider_key, pid) VALUES ($1, $2, $3) RETURNING id`,
					a.Key(), a.DerivedKey("charge"), os.Getpid()).Scan(&id); err != nil {
					http.Error(rw, err.Error(), 500)
					return
				}
				charge = fmt.Sprint(id)
				if err := a.Checkpoint(r.Context(), "charged", []byte(charge)); err != nil {
					http.Error(rw, err.Error(), 500)
					return
				}
				w.Say("charged %s", charge)
			}
			result = map[string]any{"charge": charge, "attempt": a.Attempts(), "resumed": point == "charged"}
		case "atomic":
			var id int
			if err := idempotency.Tx(r.Context()).QueryRow(r.Context(), `INSERT INTO idem_orders (key, pid) VALUES ($1, $2) RETURNING id`,
				a.Key(), os.Getpid()).Scan(&id); err != nil {
				http.Error(rw, err.Error(), 500)
				return
			}
			w.Say("ordered %d", id)
			result = map[string]any{"order": id, "pid": os.Getpid()}
		}
		if hang {
			<-ctx.Done() // SIGKILL comes first
		}
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(rw).Encode(result)
	}
	mw, err := idempotency.Middleware(pool, &idempotency.Config{Atomic: mode == "atomic", Lease: idemLease,
		Scope: func(*http.Request) (string, error) { return idemScope, nil }})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mw(http.HandlerFunc(handler))}
	w.Say("listening http://%s", ln.Addr())
	go func() { _ = w.Await("quit"); _ = srv.Close() }()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// idemPost sends POST url/pay with key and body, and returns the status and body; an error
// for a connection that broke.
func idemPost(url, key, body string) (int, string, http.Header, error) {
	req, err := http.NewRequest("POST", url+"/pay", strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Idempotency-Key", key)
	// No keep-alive: Go's transport would itself retry a keyed request on a reused
	// connection that breaks, and this test drives the retries.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

func TestIdempotencyKeyRecoveredAfterSIGKILL(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"phases", "atomic"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, schema := workerDB(t, idemSchema)
			start := func(name, hang string) (*workerproc.Proc, string) {
				p, err := startWorker(t, name, idemRole, pgtest.URL(t), schema, map[string]string{"MODE": mode, "HANG": hang})
				if err != nil {
					t.Fatal(err)
				}
				line, err := p.Expect(pgtest.WaitLimit, "listening ")
				if err != nil {
					t.Fatal(err)
				}
				return p, strings.TrimPrefix(line, "listening ")
			}
			const key, body = "order-42", `{"amount":1000}`

			first, url1 := start("first", "1")
			broken := pgtest.Go(func() (int, error) {
				status, _, _, err := idemPost(url1, key, body)
				return status, err
			})
			effect, err := first.Expect(pgtest.WaitLimit, "charged ", "ordered ")
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = first.Wait(pgtest.WaitLimit)
			if status, err := broken.Wait(t); err == nil {
				t.Fatalf("the killed server answered the first request: %d", status)
			}

			// The retry, to a new process. The killed holder's lease lapses within
			// idemLease; until then the key is still held and the answer is 409, which a
			// client retries. Nothing else may be answered.
			second, url2 := start("second", "0")
			var (
				status int
				reply  string
				header http.Header
			)
			deadline := time.Now().Add(pgtest.WaitLimit)
			for {
				status, reply, header, err = idemPost(url2, key, body)
				if err != nil {
					t.Fatal(err)
				}
				if status != http.StatusConflict || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if status != http.StatusCreated {
				t.Fatalf("retry after SIGKILL = %d %s; want the key recovered and the request served", status, reply)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(reply), &got); err != nil {
				t.Fatal(err)
			}
			var effects, others int
			switch mode {
			case "phases":
				// Resumed from the recovery point: the first attempt's charge, not a new one.
				want := strings.TrimPrefix(effect, "charged ")
				if got["charge"] != want || got["resumed"] != true || got["attempt"] != float64(2) {
					t.Errorf("retry answered %v; want charge %s resumed by attempt 2", got, want)
				}
				err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE provider_key <> $1) FROM idem_charges`,
					idempotency.DerivedKey(idemScope, key, "charge")).Scan(&effects, &others)
			case "atomic":
				// The killed attempt's order rolled back; the retry's committed.
				if got["pid"] != float64(second.Pid()) {
					t.Errorf("retry answered %v; want the order of the second process (pid %d)", got, second.Pid())
				}
				err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pid <> $1) FROM idem_orders`,
					second.Pid()).Scan(&effects, &others)
			}
			if err != nil {
				t.Fatal(err)
			}
			if effects != 1 || others != 0 {
				t.Fatalf("%d effects (%d unexpected); want the effect exactly once", effects, others)
			}
			// Every later repeat replays the stored response.
			status2, reply2, header2, err := idemPost(url2, key, body)
			if err != nil || status2 != status || reply2 != reply || header2.Get("Idempotent-Replayed") != "true" || header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("repeat = %d %q (%v), replayed=%q; want %d %q replayed", status2, reply2, err, header2.Get("Idempotent-Replayed"), status, reply)
			}
			_ = second.Send("quit")
			if err := second.Wait(pgtest.WaitLimit); err != nil {
				t.Fatal(err)
			}
		})
	}
}
