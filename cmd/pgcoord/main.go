// Command pgcoord operates the pgcoord coordination toolkit: migrations, inspection and
// benchmarks. Run 'pgcoord --help'.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgcoord/pgcoord/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
