//go:build unix

// Package workerproc runs code in worker processes: real processes that a test or the demo
// pauses with SIGSTOP (a real GC pause, not a simulation), kills with SIGKILL, or runs side
// by side as replicas that share nothing but the database.
//
// A worker process is the parent's own executable run again: Start sets the role to run in
// its environment, and Main, called first in main (or in TestMain of a test binary), runs
// that role and exits instead of going on as the parent. A worker and its parent talk by
// lines: the worker says what it did on stdout (Worker.Say) and reads instructions on stdin
// (Worker.Await); the parent reads those lines with Proc.Expect or Group.Next and writes
// instructions with Proc.Send. A worker whose stdin closes (its parent is gone or stopped
// it) has its context cancelled.
package workerproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcoord/pgcoord/internal/pgconfig"
)

// Environment of a worker process.
const (
	envRole   = "PGCOORD_WORKER_ROLE"   // the key of the roles to run
	envURL    = "PGCOORD_WORKER_URL"    // the database
	envSchema = "PGCOORD_WORKER_SCHEMA" // the schema (search_path) of the worker's pool
	envParam  = "PGCOORD_WORKER_P_"     // prefix of the role's parameters
	envName   = "PGCOORD_WORKER_NAME"   // Spec.Name, for the pool's application_name
	envLife   = "PGCOORD_WORKER_LIFETIME"
)

// Lifetime bounds a worker's own work unless Spec.Lifetime says otherwise, so an orphan
// never lingers: the context of its role ends after it, and the worker exits with an error
// (a parent that still needed it learns so). Time spent stopped counts too.
const Lifetime = 2 * time.Minute

// errLifetime is the cause of a role's context that ended with the worker's lifetime.
var errLifetime = errors.New("the worker's lifetime passed before its parent stopped it")

// Role is the program of a worker process. It returns nil after saying what it did; an
// error is said as "error <message>" and the process exits with 1.
type Role func(ctx context.Context, w *Worker) error

// Worker is what a role works with inside its process.
type Worker struct {
	// Pool connects to the parent's database (Spec.URL) with its schema (Spec.Schema) as
	// search_path. It connects on first use.
	Pool *pgxpool.Pool
	ctx  context.Context
	in   chan string
	mu   sync.Mutex
}

// Main runs the role of roles named by the environment and exits, when this process was
// started by Start; otherwise it returns at once. Call it first in main, and in TestMain of
// a test binary that starts workers.
func Main(roles map[string]Role) {
	name := os.Getenv(envRole)
	if name == "" {
		return
	}
	// A worker exits here, never through the testing package or the demo: it prints
	// nothing but its own lines, and its exit code is its verdict.
	if err := run(name, roles[name]); err != nil {
		fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	os.Exit(0)
}

func run(name string, role Role) error {
	if role == nil {
		return fmt.Errorf("unknown worker role %q", name)
	}
	lifetime := Lifetime
	if s := os.Getenv(envLife); s != "" {
		var err error
		if lifetime, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("%s: %w", envLife, err)
		}
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), lifetime, errLifetime)
	defer cancel()
	cfg, err := pgconfig.Pool(os.Getenv(envURL), pgconfig.Options{
		AppName: AppName(os.Getenv(envName)), Schema: os.Getenv(envSchema), MaxConns: 8,
	})
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	w := &Worker{Pool: pool, ctx: ctx, in: make(chan string)}
	go func() { // stdin: instructions; its end stops the worker
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			select {
			case w.in <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		cancel()
	}()
	err = role(ctx, w)
	if err == nil && errors.Is(context.Cause(ctx), errLifetime) {
		err = fmt.Errorf("%w (%v)", errLifetime, lifetime)
	}
	return err
}

// Param returns the role parameter name (Spec.Params).
func (w *Worker) Param(name string) string { return os.Getenv(envParam + name) }

// Say writes one line to the parent.
func (w *Worker) Say(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// Next waits for the parent's next instruction; it returns an error if the worker's context
// ends first (its stdin closed, or its lifetime passed).
func (w *Worker) Next() (string, error) {
	select {
	case line := <-w.in:
		return line, nil
	case <-w.ctx.Done():
		return "", fmt.Errorf("no instruction: %w", context.Cause(w.ctx))
	}
}

// Await waits for the parent's next instruction and returns an error unless it is want.
func (w *Worker) Await(want string) error {
	got, err := w.Next()
	if err != nil {
		return fmt.Errorf("waiting for %q: %w", want, err)
	}
	if got != want {
		return fmt.Errorf("got %q on stdin, want %q", got, want)
	}
	return nil
}
