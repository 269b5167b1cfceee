package netfault

import (
	"os/exec"
	"syscall"
)

// setParentDeath has the server killed when the test process dies, even
// by SIGKILL, so no proxy outlives its test.
func setParentDeath(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
