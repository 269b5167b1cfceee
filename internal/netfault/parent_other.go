//go:build !linux

package netfault

import "os/exec"

// setParentDeath does nothing here: the server is killed at the test's
// cleanup.
func setParentDeath(*exec.Cmd) {}
