//go:build unix

package cli

import (
	"os/exec"
	"syscall"
)

// setProcessGroup starts c in a process group of its own, so that stopping it stops the
// processes it started too.
func setProcessGroup(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to every process of the group pgid.
func signalGroup(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }

// groupAlive reports whether any process of the group pgid is left.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }
