//go:build unix

package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcoord/pgcoord/fenced"
	"github.com/pgcoord/pgcoord/internal/workerproc"
	"github.com/pgcoord/pgcoord/leases"
)

// Incident 1, the double charge. Worker A takes the lease of order 42 and is paused
// (SIGSTOP: a stop-the-world GC pause, for all it can tell) before it charges. The lease
// expires by the database clock; worker B takes it over and charges. Then A wakes up,
// still believing it holds the lease, and charges too — unless something stops it:
//
//   - naive: a lock with a TTL and nothing else. A's charge goes through: two charges.
//   - fenced: the charge is written in a transaction that first checks the lease with
//     fenced.CheckLease, which holds the grant until the transaction ends. A's grant is no
//     longer current (B's token is higher), so A's late charge is refused (leases.ErrLost)
//     and writes nothing — in every interleaving: no takeover completes while a charging
//     transaction is open, so B cannot be granted between A's check and A's commit.
//   - provider: the same plain lock, but each charge carries an idempotency key derived
//     from the order, and the payment provider keeps one charge per key: A's request gets
//     B's charge back instead of a second one.

const (
	paymentRole  = "payment"
	paymentOrder = 42
	// paymentTTL is the lease of the order: A is paused well past it.
	paymentTTL = time.Second
)

// Payment modes.
const (
	payNaive    = "naive"
	payFenced   = "fenced"
	payProvider = "provider"
)

// PaymentResult is incident 1's outcome per mode: the charges of the order, and what
// became of A's late charge ("charged", "rejected" or "replayed").
type PaymentResult struct {
	Charges map[string]int
	LateA   map[string]string
}

func (d *demo) payment(ctx context.Context) (PaymentResult, error) {
	res := PaymentResult{Charges: map[string]int{}, LateA: map[string]string{}}
	for _, mode := range []string{payNaive, payFenced, payProvider} {
		d.step("incident 1, %s: worker A takes the lease of order %d, is paused (SIGSTOP) past its TTL; B takes over", mode, paymentOrder)
		late, err := d.paymentRound(mode)
		if err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		res.LateA[mode] = late
		q := `SELECT count(*) FROM demo_charges WHERE mode = $1 AND order_id = $2`
		if mode == payProvider {
			q = `SELECT count(*) FROM demo_provider_charges WHERE $1 <> '' AND order_id = $2`
		}
		var n int
		if err := d.pool.QueryRow(ctx, q, mode, paymentOrder).Scan(&n); err != nil {
			return res, err
		}
		res.Charges[mode] = n
	}
	return res, nil
}

// paymentRound runs A and B in one mode and returns what A's late charge did.
func (d *demo) paymentRound(mode string) (string, error) {
	params := func(name string) map[string]string {
		return map[string]string{"MODE": mode, "NAME": name, "LEASE": "order:" + strconv.Itoa(paymentOrder) + ":" + mode}
	}
	a, err := d.start("A", paymentRole, params("A"))
	if err != nil {
		return "", err
	}
	defer a.Stop(5 * time.Second)
	if _, err := a.Expect(stepTimeout, "acquired"); err != nil {
		return "", err
	}
	if err := a.Signal(syscall.SIGSTOP); err != nil { // the pause, between the lock and the charge
		return "", err
	}
	b, err := d.start("B", paymentRole, params("B")) // the job is redelivered to B
	if err != nil {
		return "", err
	}
	defer b.Stop(5 * time.Second)
	if _, err := b.Expect(stepTimeout, "acquired"); err != nil { // after A's lease expired
		return "", err
	}
	if err := b.Send("charge"); err != nil {
		return "", err
	}
	if _, err := b.Expect(stepTimeout, "charged"); err != nil {
		return "", err
	}
	if err := a.Send("charge"); err != nil { // A wakes up and carries on where it stopped
		return "", err
	}
	if err := a.Signal(syscall.SIGCONT); err != nil {
		return "", err
	}
	return a.Expect(stepTimeout, "charged", "rejected", "replayed")
}

// paymentWorker is worker A or B: it takes the order's lease, says "acquired <token>",
// waits for "charge", charges, and says "charged", "rejected" or "replayed".
func paymentWorker(ctx context.Context, w *workerproc.Worker) error {
	mode, name, lease := w.Param("MODE"), w.Param("NAME"), w.Param("LEASE")
	l, err := leases.Acquire(ctx, w.Pool, lease, paymentTTL, &leases.AcquireOpts{
		Holder: "worker-" + name, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	w.Say("acquired %d", l.Token)
	if err := w.Await("charge"); err != nil {
		return err
	}
	// A believes it still holds the lease: nothing in this process tells it otherwise.
	switch mode {
	case payNaive:
		_, err = w.Pool.Exec(ctx, `INSERT INTO demo_charges (mode, order_id, worker, token) VALUES ($1, $2, $3, $4)`,
			mode, paymentOrder, name, l.Token)
		if err != nil {
			return err
		}
		w.Say("charged")
	case payFenced:
		err = pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
			// Still ours, and held until COMMIT, or leases.ErrLost and nothing is written.
			if err := fenced.CheckLease(ctx, tx, l); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO demo_charges (mode, order_id, worker, token) VALUES ($1, $2, $3, $4)`,
				mode, paymentOrder, name, l.Token)
			return err
		})
		switch {
		case errors.Is(err, leases.ErrLost):
			w.Say("rejected")
		case err != nil:
			return err
		default:
			w.Say("charged")
		}
	case payProvider:
		// The provider's side: one charge per idempotency key; a repeat gets the first back.
		var created bool
		err = w.Pool.QueryRow(ctx, `INSERT INTO demo_provider_charges (idempotency_key, order_id, worker)
			VALUES ($1, $2, $3)
			ON CONFLICT (idempotency_key) DO UPDATE SET requests = demo_provider_charges.requests + 1
			RETURNING xmax = 0`, "charge-order-"+strconv.Itoa(paymentOrder), paymentOrder, name).Scan(&created)
		if err != nil {
			return err
		}
		if created {
			w.Say("charged")
		} else {
			w.Say("replayed")
		}
	default:
		return fmt.Errorf("unknown payment mode %q", mode)
	}
	return nil
}

func (r PaymentResult) print(out io.Writer) {
	fmt.Fprintf(out, `
1. The double charge: worker A holds the lease of order %d (TTL %v) and is paused by
   SIGSTOP before it charges; B takes the lease over and charges; then A wakes up.

                        TTL lock only    lease + fencing           TTL lock + provider's idempotency key
   charges of order %d  %-16d %-25d %d
   A's late charge      %-16s %-25s %s
`, paymentOrder, paymentTTL, paymentOrder,
		r.Charges[payNaive], r.Charges[payFenced], r.Charges[payProvider],
		r.LateA[payNaive], r.LateA[payFenced]+" (lease lost)", r.LateA[payProvider]+" (B's charge)")
}
