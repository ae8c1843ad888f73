package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nri-accel/tests/internal/suite"
)

// process is a program the suite started (containerd, CRI-O or nri-accel): its command and its
// exit, kept so that any number of callers can ask whether it still runs.
type process struct {
	cmd  *exec.Cmd
	done chan error
	// group: the program runs in a process group of its own and is killed as a group, so
	// that what it forked (shims, conmon) goes with it.
	group bool
}

// start runs cmd with its output appended to logPath, after a line that says what starts when.
func (p *process) start(t *testing.T, cmd *exec.Cmd, logPath, what string) {
	t.Helper()
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer log.Close()
	fmt.Fprintf(log, "\n===== e2e: %s starting at %s\n", what, time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = log, log
	if p.group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	must(t, cmd.Start())
	p.cmd = cmd
	p.done = make(chan error, 1)
	go func() { p.done <- cmd.Wait() }()
}

// Running reports whether the process is alive.
func (p *process) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case err := <-p.done:
		p.done <- err
		return false
	default:
		return true
	}
}

// signal sends sig to the process if it runs.
func (p *process) signal(sig syscall.Signal) {
	if p.Running() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill ends the process at once (SIGKILL, to its group where it has one) and waits for it.
func (p *process) Kill() {
	if !p.Running() {
		return
	}
	if p.group {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = p.cmd.Process.Kill()
	}
	err := <-p.done
	p.done <- err
}

// stop sends SIGTERM and waits up to grace; past it, beforeKill runs (a goroutine dump, say)
// and the process is killed.
func (p *process) stop(grace time.Duration, beforeKill func()) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(grace):
		if beforeKill != nil {
			beforeKill()
		}
		p.Kill()
	}
}

// awaitCRI waits until the runtime's CRI on socket answers, or the process exits; false if it
// did not come up.
func (p *process) awaitCRI(socket string) bool {
	ok := waitFor(60*time.Second, func() bool {
		if !p.Running() {
			return true
		}
		cri, err := dialCRI(socket)
		if err != nil {
			return false
		}
		defer cri.Close()
		return cri.Ready() == nil
	})
	return ok && p.Running()
}

// cleanupRuntime removes what a runtime under dir left behind: the containers under each runc
// root (a root holds container dirs), the processes whose command line names both monitor (the
// shim or conmon) and owner (the runtime's socket or dir), and every mount under dir.
func cleanupRuntime(dir string, runcRoots []string, monitor, owner string) {
	for _, root := range runcRoots {
		ids, _ := os.ReadDir(root)
		for _, id := range ids {
			_ = exec.Command("runc", "--root", root, "kill", id.Name(), "KILL").Run()
			_ = exec.Command("runc", "--root", root, "delete", "--force", id.Name()).Run()
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(p.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if strings.Contains(string(cmdline), monitor) && strings.Contains(string(cmdline), owner) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	suite.UnmountUnder(dir)
}

// tail answers the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
