package integration_test

import (
	"os/exec"
	"syscall"
)

// setWorkerDeathSignal makes the kernel kill the worker if the test process dies first, so
// a stopped worker can never outlive a crashed or killed test run. (The signal is tied to
// the thread that started the worker; the Go runtime does not end threads under a running
// test, so it only fires when the test process is gone.)
func setWorkerDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
