package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is a program the cluster started, in a process group of its own (so what it forks goes
// with it), its output appended to its log.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
	Log  string
	// args and env start it again (restart).
	args []string
	env  []string
}

func startProc(t *testing.T, name, logPath string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, Log: logPath, args: args, env: env}
	p.start(t)
	return p
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	log, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer log.Close()
	fmt.Fprintf(log, "\n===== cluster: %s starting at %s: %s\n", p.name, time.Now().Format(time.RFC3339Nano), strings.Join(p.args, " "))
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	p.cmd = cmd
	p.done = make(chan error, 1)
	go func() { p.done <- cmd.Wait() }()
}

// Running reports whether the process is alive.
func (p *proc) Running() bool {
	if p == nil || p.cmd == nil {
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

// Kill ends the process group at once (SIGKILL) and waits for the process.
func (p *proc) Kill() {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	err := <-p.done
	p.done <- err
}

// Stop sends SIGTERM to the group and kills it after grace.
func (p *proc) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(grace):
		p.Kill()
	}
}

// Restart stops the process and starts it again with the same command.
func (p *proc) Restart(t *testing.T) {
	t.Helper()
	p.Stop(10 * time.Second)
	p.start(t)
}

// freePort answers a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond every 200 ms until it holds or `within` passes; it answers whether it held.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// killUnder kills every process whose command line names dir (shims and containers' processes
// the cluster left), and every runc container under the runc roots below dir.
func killUnder(dir string) {
	runcRoot := filepath.Join(dir, "containerd", "runc")
	nss, _ := os.ReadDir(runcRoot)
	for _, ns := range nss {
		root := filepath.Join(runcRoot, ns.Name())
		ids, _ := os.ReadDir(root)
		for _, id := range ids {
			_ = exec.Command("runc", "--root", root, "kill", id.Name(), "KILL").Run()
			_ = exec.Command("runc", "--root", root, "delete", "--force", id.Name()).Run()
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(p.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if strings.Contains(string(cmdline), dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
