package cluster

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The pod network. The suite's test pods use the host network, but the DaemonSets nri-accel
// ships do not, and nri-accel in them reaches the API server the in-cluster way: the kubernetes
// Service's address (KUBERNETES_SERVICE_HOST, 10.96.0.1:443). There is no kube-proxy and the
// machine's network is not the suite's to change, so a CNI plugin of the suite's own (a shell
// script) gives each pod a network namespace that holds only its own interfaces: lo, with the
// Service's address on it, and eth0 (a bridge with no ports, holding the pod's address), and
// asks the suite to serve the Service there. The suite opens a listener on 10.96.0.1:443 inside
// that namespace and forwards each connection to the API server on the machine's loopback: what
// kube-proxy does, without a rule on the machine.

// serviceIP is the kubernetes Service's ClusterIP (the first of --service-cluster-ip-range).
const serviceIP = "10.96.0.1"

const cniPluginName = "nri-accel-test-net"

// cniLoopback is the `loopback` plugin containerd always runs first: lo up in the pod's namespace.
const cniLoopback = `#!/bin/sh
# The cluster suite's loopback CNI plugin (tests/cluster/podnet_test.go).
set -eu
v=$(sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p' | head -1)
case "$CNI_COMMAND" in
ADD)
    nsenter --net="$CNI_NETNS" ip link set lo up
    printf '{"cniVersion":"%s","interfaces":[{"name":"lo","sandbox":"%s"}],"ips":[{"version":"4","address":"127.0.0.1/8","interface":0}]}\n' "${v:-1.0.0}" "$CNI_NETNS"
    ;;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}' ;;
*) ;;
esac
`

// cniPlugin is the pod network's plugin: ADD sets the pod's namespace up, hands its path to the
// suite and waits (at most 30 s) until the Service is served there; DEL only tells the suite.
const cniPlugin = `#!/bin/sh
# The cluster suite's pod network (tests/cluster/podnet_test.go).
set -eu
cat >/dev/null
dir=%q
innet() { nsenter --net="$CNI_NETNS" "$@"; }
case "$CNI_COMMAND" in
ADD)
    n=$(ls "$dir/leases" | wc -l); n=$((n + 2)); touch "$dir/leases/$CNI_CONTAINERID"
    innet ip addr add %s/32 dev lo
    innet ip link add "$CNI_IFNAME" type bridge
    innet ip link set "$CNI_IFNAME" up
    innet ip addr add "10.244.$((n / 250)).$((n %% 250 + 2))/32" dev "$CNI_IFNAME"
    echo "$CNI_NETNS" > "$dir/requests/$CNI_CONTAINERID.tmp"
    mv "$dir/requests/$CNI_CONTAINERID.tmp" "$dir/requests/$CNI_CONTAINERID"
    i=0
    until [ -e "$dir/served/$CNI_CONTAINERID" ]; do
        i=$((i + 1)); [ "$i" -le 300 ] || { echo '{"cniVersion":"1.0.0","code":11,"msg":"the suite did not serve the Service"}'; exit 1; }
        sleep 0.1
    done
    printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%%s","sandbox":"%%s"}],"ips":[{"address":"10.244.%%d.%%d/32","interface":0}]}\n' \
        "$CNI_IFNAME" "$CNI_NETNS" $((n / 250)) $((n %% 250 + 2))
    ;;
DEL) rm -f "$dir/leases/$CNI_CONTAINERID"; touch "$dir/released/$CNI_CONTAINERID" ;;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
*) ;;
esac
`

// podNet serves the kubernetes Service in the pods' network namespaces.
type podNet struct {
	dir       string
	apiserver string // host:port on the machine's loopback
	mu        sync.Mutex
	listeners map[string]net.Listener
	stop      chan struct{}
	done      chan struct{}
	errs      []string
}

// startPodNet writes the plugins and its network config for containerd (binDir, confDir) and starts
// serving requests.
func (c *Cluster) startPodNet(t *testing.T, binDir, confDir string) {
	t.Helper()
	d := filepath.Join(c.Dir, "podnet")
	for _, sub := range []string{"requests", "served", "released", "leases"} {
		must(t, os.MkdirAll(filepath.Join(d, sub), 0o755))
	}
	must(t, os.MkdirAll(binDir, 0o755))
	must(t, os.MkdirAll(confDir, 0o755))
	plugin := cniPlugin
	if c.podSubnet != "" {
		// A fleet's node hands out addresses of its own (fleet_test.go).
		plugin = strings.ReplaceAll(plugin, "10.244.", c.podSubnet)
	}
	must(t, os.WriteFile(filepath.Join(binDir, cniPluginName), []byte(fmt.Sprintf(plugin, d, serviceIP)), 0o755))
	must(t, os.WriteFile(filepath.Join(binDir, "loopback"), []byte(cniLoopback), 0o755))
	must(t, os.WriteFile(filepath.Join(confDir, "10-"+cniPluginName+".conflist"), []byte(
		`{"cniVersion":"1.0.0","name":"`+cniPluginName+`","plugins":[{"type":"`+cniPluginName+`"}]}`), 0o644))
	c.PodNet = &podNet{dir: d, apiserver: strings.TrimPrefix(c.Server, "https://"),
		listeners: map[string]net.Listener{}, stop: make(chan struct{}), done: make(chan struct{})}
	go c.PodNet.serve(c)
}

// serve answers the plugin's requests until stopped.
func (p *podNet) serve(c *Cluster) {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		reqs, _ := os.ReadDir(filepath.Join(p.dir, "requests"))
		for _, r := range reqs {
			id := r.Name()
			if strings.HasSuffix(id, ".tmp") {
				continue
			}
			path := filepath.Join(p.dir, "requests", id)
			ns, err := os.ReadFile(path)
			_ = os.Remove(path)
			if err != nil {
				continue
			}
			// The namespace's path is one of containerd's mount namespace: reach it through the
			// holder's root.
			l, err := listenIn(c.nodePath(strings.TrimSpace(string(ns))), net.JoinHostPort(serviceIP, "443"))
			if err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Sprintf("%s: %v", id, err))
				p.mu.Unlock()
				continue
			}
			p.mu.Lock()
			p.listeners[id] = l
			p.mu.Unlock()
			go p.forward(l)
			_ = os.WriteFile(filepath.Join(p.dir, "served", id), nil, 0o644)
		}
		rels, _ := os.ReadDir(filepath.Join(p.dir, "released"))
		for _, r := range rels {
			p.mu.Lock()
			if l := p.listeners[r.Name()]; l != nil {
				l.Close()
				delete(p.listeners, r.Name())
			}
			p.mu.Unlock()
			_ = os.Remove(filepath.Join(p.dir, "released", r.Name()))
			_ = os.Remove(filepath.Join(p.dir, "served", r.Name()))
		}
	}
}

// forward copies each connection accepted in a pod's namespace to the API server and back.
func (p *podNet) forward(l net.Listener) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := net.DialTimeout("tcp", p.apiserver, 5*time.Second)
			if err != nil {
				return
			}
			defer out.Close()
			go func() { _, _ = io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(in, out)
		}()
	}
}

// Stop closes every listener.
func (p *podNet) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, l := range p.listeners {
		l.Close()
		delete(p.listeners, id)
	}
}

// listenIn opens a TCP listener inside the network namespace at nsPath: the socket is made on a
// thread switched into that namespace and keeps to it; the thread is switched back.
func listenIn(nsPath, addr string) (net.Listener, error) {
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	runtime.LockOSThread()
	own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer own.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("setns %s: %v", nsPath, err)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the pod's namespace: keep it locked so that it ends with this
		// goroutine instead of running others.
		if l != nil {
			l.Close()
		}
		return nil, fmt.Errorf("setns back: %v", err)
	}
	runtime.UnlockOSThread()
	return l, lerr
}
