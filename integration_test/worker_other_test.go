//go:build unix && !linux

package integration_test

import "os/exec"

// setWorkerDeathSignal does nothing where the kernel cannot signal a child when its parent
// dies; t.Cleanup still kills workers, and a worker exits on its own when its stdin closes
// or its lifetime ends.
func setWorkerDeathSignal(*exec.Cmd) {}
