package integration_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pgcoord/pgcoord/internal/pgtest"
	"github.com/pgcoord/pgcoord/internal/workerproc"
)

func TestMain(m *testing.M) {
	workerproc.Main(workerRoles) // this test binary is also the tests' worker processes
	pgtest.Main(m)
}

var binary struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// pgcoordBinary builds cmd/pgcoord once per test run and returns its path, so tests drive
// the real command as a separate process, exit codes and all.
func pgcoordBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		dir, err := os.MkdirTemp("", "pgcoord-bin-")
		if err != nil {
			binary.err = err
			return
		}
		binary.path = filepath.Join(dir, "pgcoord")
		cmd := exec.Command("go", "build", "-o", binary.path, "github.com/pgcoord/pgcoord/cmd/pgcoord")
		binary.out, binary.err = cmd.CombinedOutput()
	})
	if binary.err != nil {
		t.Fatalf("building pgcoord: %v\n%s", binary.err, binary.out)
	}
	return binary.path
}
