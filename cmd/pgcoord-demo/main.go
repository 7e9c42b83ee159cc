//go:build unix

// Command pgcoord-demo replays the three incidents pgcoord exists for — the double charge,
// the weekly email sent three times, the tenant that starves the others — with real
// processes, first the naive way and then with pgcoord, and prints the outcomes side by side.
//
// With PGCOORD_DATABASE_URL set it runs in that database, in a schema of its own that it
// drops at the end. Otherwise it starts a throwaway PostgreSQL container (image
// PGCOORD_DEMO_IMAGE, default the official postgres:17) and removes it at the end.
//
//	make demo
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	tclog "github.com/testcontainers/testcontainers-go/log"

	"github.com/pgcoord/pgcoord/internal/demo"
	"github.com/pgcoord/pgcoord/internal/pgcontainer"
)

func main() {
	demo.WorkerMain() // the demo's worker processes are this program too
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgcoord-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	url := os.Getenv("PGCOORD_DATABASE_URL")
	if url == "" {
		image := os.Getenv("PGCOORD_DEMO_IMAGE")
		fmt.Fprintf(os.Stderr, "demo: PGCOORD_DATABASE_URL is not set: starting a throwaway PostgreSQL (%s)\n",
			orDefault(image, pgcontainer.DefaultImage))
		tclog.SetDefault(log.New(io.Discard, "", 0)) // the demo reports its own progress
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		srv, err := pgcontainer.Start(sctx, image)
		cancel()
		if err != nil {
			return fmt.Errorf("%w (set PGCOORD_DATABASE_URL to use a database of yours instead)", err)
		}
		defer func() {
			if err := srv.Terminate(); err != nil {
				fmt.Fprintln(os.Stderr, "demo: removing the container:", err)
			}
		}()
		url = srv.URL
	}
	_, err := demo.Run(ctx, demo.Config{DatabaseURL: url, Out: os.Stdout, Progress: os.Stderr})
	return err
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
