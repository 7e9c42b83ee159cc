package workerproc

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the worker if its parent dies first, so a stopped
// worker can never outlive a crashed or killed test run. (The signal is tied to the thread
// that started the worker; the Go runtime does not end threads under a running program, so
// it only fires when the parent is gone.)
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
