//go:build !linux

package cli

// hideSecrets hides the password in the command line and environment on Linux only.
func hideSecrets(*app) {}

// keepMemoryFromChildren does something on Linux only.
func keepMemoryFromChildren() error { return nil }
