package base

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// NewHolderID returns a new holder identity, "host/pid/random", unique per call: the
// default identity of a lease holder, a semaphore permit holder or a job runner, so two
// calls never share a grant, and an operator can find the process behind it.
func NewHolderID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", hostname, os.Getpid(), hex.EncodeToString(b))
}

var hostname, _ = os.Hostname()
