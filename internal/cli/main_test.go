package cli_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/pgcoord/pgcoord/internal/cli"
	"github.com/pgcoord/pgcoord/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// run runs the pgcoord command in-process and returns its exit code and output streams.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}
