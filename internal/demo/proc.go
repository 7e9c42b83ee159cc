//go:build unix

package demo

import (
	"time"

	"github.com/pgcoord/pgcoord/internal/workerproc"
)

// Worker processes. The demo's replicas and workers are real processes (see
// internal/workerproc): the demo runs its own executable again, and WorkerMain, called
// first in main, runs the worker's role instead of the demo. So a pause is a real SIGSTOP
// and a crash a real SIGKILL.

// stepTimeout bounds every wait of the demo for a worker.
const stepTimeout = 30 * time.Second

// roles maps a role name to the program a worker process runs.
var roles = map[string]workerproc.Role{
	paymentRole:  paymentWorker,
	emailRole:    emailWorker,
	tenantRole:   tenantWorker,
	scheduleRole: scheduleWorker,
}

// WorkerMain runs the worker role named by the environment and exits, when this process was
// started by the demo as a worker; otherwise it returns at once. Call it first in main (and
// in TestMain of tests that run the demo).
func WorkerMain() { workerproc.Main(roles) }

// start starts a worker process, named name, running role with params against the demo's
// schema; the demo stops it at the latest when it ends.
func (d *demo) start(name, role string, params map[string]string) (*workerproc.Proc, error) {
	p, err := workerproc.Start(workerproc.Spec{Name: name, Role: role, URL: d.url, Schema: d.schema, Params: params})
	if err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	return p, nil
}
