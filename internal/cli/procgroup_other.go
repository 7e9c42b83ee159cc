//go:build !unix

package cli

import (
	"os"
	"os/exec"
	"syscall"
)

// Without Unix process groups, `leases run` stops only the command itself, not processes
// it started, and any signal stops it at once.

func setProcessGroup(*exec.Cmd) {}

func signalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

func groupAlive(int) bool { return false }
