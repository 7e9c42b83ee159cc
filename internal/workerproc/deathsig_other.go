//go:build unix && !linux

package workerproc

import "os/exec"

// setDeathSignal does nothing where the kernel cannot signal a child when its parent dies;
// Stop still kills workers, and a worker exits on its own when its stdin closes or its
// Lifetime ends.
func setDeathSignal(*exec.Cmd) {}
