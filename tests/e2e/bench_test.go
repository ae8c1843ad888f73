package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// templatePeer is NRI's Go template plugin (github.com/containerd/nri/plugins/template), pinned
// under tests/peers like the runtimes: the benchmark's yardstick for a Go plugin's cost.
const templatePeer = "nri-template-v0.12.2"

// The benchmark's configurations: no NRI plugin connected, the template plugin, nri-accel.
var benchConfigs = []string{"none", "template", "nri-accel"}

// benchSample is one measured pod: the latency of each CRI call the kubelet makes to start it.
type benchSample struct {
	Config string        `json:"config"`
	Round  int           `json:"round"`
	Ask    bool          `json:"ask"` // the pod carries the exclusive-device annotation
	Run    time.Duration `json:"run_pod_sandbox_ns"`
	Create time.Duration `json:"create_container_ns"`
	Start  time.Duration `json:"start_container_ns"`
	// Handler is nri-accel's own time in its CreateContainer handler (its nri_event_duration
	// histogram's sum, read after each pod).
	Handler time.Duration `json:"nri_accel_handler_ns,omitempty"`
}

// benchRSS is a plugin's memory with many containers running.
type benchRSS struct {
	Plugin     string `json:"plugin"`
	Containers int    `json:"containers"`
	IdleKiB    int    `json:"idle_vmrss_kib"` // after connecting, no container running
	RSSKiB     int    `json:"vmrss_kib"`
	HWMKiB     int    `json:"vmhwm_kib"`
}

// benchReport is what a run writes to bench.json under the results dir.
type benchReport struct {
	Version    string        `json:"containerd"`
	NRI        string        `json:"nri"`
	Template   string        `json:"template_peer"`
	AccelBin   string        `json:"nri_accel_bin"`
	Pods       int           `json:"pods_per_config"`
	Round      int           `json:"pods_per_round"`
	CPUs       int           `json:"cpus"`
	LoadBefore string        `json:"loadavg_before"`
	LoadAfter  string        `json:"loadavg_after"`
	Started    time.Time     `json:"started"`
	Took       time.Duration `json:"took_ns"`
	Samples    []benchSample `json:"samples"`
	RSS        []benchRSS    `json:"rss"`
}

// TestBench_CreateContainer is the benchmark of issue 26 item 4, not a test: figures, no timed
// assertion (docs/performance.md, "Real containerd"). It runs only with NRI_ACCEL_E2E_BENCH=1.
// Per containerd version, on one node: RunPodSandbox, CreateContainer and StartContainer through
// the CRI, timed, NRI_ACCEL_E2E_BENCH_PODS pods (default 200) for each configuration (no plugin,
// NRI's template plugin, nri-accel), in rounds of NRI_ACCEL_E2E_BENCH_ROUND pods (default 50)
// whose order rotates from round to round so drift of the machine's load falls on every
// configuration alike. Every second pod asks for an exclusive device by annotation (in every
// configuration, so the runtime sees the same requests); an asking pod is removed once measured,
// which frees its device for the next ask, and the others at the end of the round. Each segment
// starts with one unmeasured pod (the first create after a plugin connects). Then nri-accel and
// the template plugin, both connected, see NRI_ACCEL_E2E_BENCH_RSS_CONTAINERS (default 100)
// containers start, and their VmRSS is read. The table goes to the log and, with every sample,
// to the results dir.
func TestBench_CreateContainer(t *testing.T) {
	if os.Getenv("NRI_ACCEL_E2E_BENCH") == "" {
		t.Skip("SKIPPED: the CRI benchmark runs only with NRI_ACCEL_E2E_BENCH=1 (tests/README.md)")
	}
	pods := envInt("NRI_ACCEL_E2E_BENCH_PODS", 200)
	round := envInt("NRI_ACCEL_E2E_BENCH_ROUND", 50)
	rssContainers := envInt("NRI_ACCEL_E2E_BENCH_RSS_CONTAINERS", 100)
	eachVersion(t, func(t *testing.T, v string) {
		tmpl := filepath.Join(buildPeer(t, templatePeer), "template")
		layout := defaultLayout(t, 0)
		layout.WholeDevices = 2
		n := startNode(t, v, "device-nodes", NodeOptions{Layout: layout, NoAccel: true})
		metrics := enableMetrics(t, n.Accel)
		t.Cleanup(func() { // before the node's teardown removes its dir
			if t.Failed() {
				logs, _ := filepath.Glob(filepath.Join(n.Dir, "template-*.log"))
				_ = os.MkdirAll(resultsDir(t), 0o755)
				for _, l := range logs {
					_ = exec.Command("cp", l, resultsDir(t)).Run()
				}
			}
		})
		b := &bench{n: n, template: tmpl, metrics: metrics, wholeDevices: layout.WholeDevices}
		rep := &benchReport{
			Version: v, NRI: nriOf[v], Template: templatePeer, AccelBin: n.Accel.Bin, Pods: pods, Round: round,
			CPUs: runtime.NumCPU(), LoadBefore: loadavg(), Started: time.Now(),
		}
		for r := 0; r*round < pods; r++ {
			size := min(round, pods-r*round)
			for k := range benchConfigs {
				rep.Samples = append(rep.Samples, b.segment(t, benchConfigs[(r+k)%len(benchConfigs)], r, size)...)
			}
		}
		rep.RSS = b.rss(t, rssContainers)
		rep.LoadAfter = loadavg()
		rep.Took = time.Since(rep.Started)

		table := benchTable(rep)
		t.Log("\n" + table)
		res := resultsDir(t)
		must(t, os.MkdirAll(res, 0o755))
		js, err := json.MarshalIndent(rep, "", " ")
		must(t, err)
		must(t, os.WriteFile(filepath.Join(res, "bench.json"), js, 0o644))
		must(t, os.WriteFile(filepath.Join(res, "bench.txt"), []byte(table), 0o644))
		t.Logf("benchmark results in %s", res)
	})
}

type bench struct {
	n            *Node
	template     string
	metrics      string // nri-accel's /metrics URL
	wholeDevices int
	starts       int
}

// segment runs `size` measured pods in configuration cfg: it connects the configuration's plugin,
// runs the pods and disconnects the plugin.
func (b *bench) segment(t *testing.T, cfg string, r, size int) []benchSample {
	t.Helper()
	n := b.n
	var tmpl *goPlugin
	switch cfg {
	case "template":
		tmpl = b.startTemplate(t)
		defer tmpl.Stop()
	case "nri-accel":
		n.Accel.Start(t)
		defer n.Accel.Stop()
	}
	var samples []benchSample
	var keep []string
	var handled time.Duration // nri-accel's CreateContainer time so far
	for i := -1; i < size; i++ {
		ask := i%2 != 0 // the warm-up pod (-1) asks too: the path the segment measures is warm
		name := fmt.Sprintf("bench-%s-%d-%d", cfg, r, i)
		s, pod, ctr := b.pod(t, name, ask)
		switch {
		case cfg == "nri-accel":
			if ask {
				b.assertGranted(t, ctr)
			}
			sum, count := b.createHandlerTime(t)
			if count != i+2 {
				t.Fatalf("nri-accel counted %d CreateContainer events after %d pods", count, i+2)
			}
			s.Handler, handled = sum-handled, sum
		case cfg == "template" && i == size-1:
			// The template plugin was in the path: it logged the create.
			if !fileContains(tmpl.log, "Creating container e2e/"+name+"/app") {
				t.Fatalf("the template plugin did not see %s's CreateContainer:\n%s", name, tail(tmpl.log, 10))
			}
		}
		if i >= 0 {
			s.Config, s.Round = cfg, r
			samples = append(samples, s)
		}
		if ask {
			if err := n.CRI.RemovePod(pod); err != nil {
				t.Fatalf("%s round %d pod %d: RemovePodSandbox: %v", cfg, r, i, err)
			}
		} else {
			keep = append(keep, pod)
		}
	}
	for _, pod := range keep {
		if err := n.CRI.RemovePod(pod); err != nil {
			t.Fatalf("%s round %d: RemovePodSandbox: %v", cfg, r, err)
		}
	}
	return samples
}

// pod runs one pod with one container, timing each call; an asking pod carries the annotation
// of an exclusive device for its container.
func (b *bench) pod(t *testing.T, name string, ask bool) (benchSample, string, string) {
	t.Helper()
	var ann map[string]string
	if ask {
		ann = annotation("app", exclusiveAsk)
	}
	c := b.n.CRI
	t0 := time.Now()
	p, err := c.RunPod(name, ann)
	if err != nil {
		t.Fatalf("%s: RunPodSandbox: %v", name, err)
	}
	t1 := time.Now()
	id, err := c.CreateContainer(p, "app")
	if err != nil {
		t.Fatalf("%s: CreateContainer: %v", name, err)
	}
	t2 := time.Now()
	if err := c.StartContainer(id); err != nil {
		t.Fatalf("%s: StartContainer: %v", name, err)
	}
	t3 := time.Now()
	return benchSample{Ask: ask, Run: t1.Sub(t0), Create: t2.Sub(t1), Start: t3.Sub(t2)}, p.ID, id
}

// assertGranted checks, outside the timing, that nri-accel's grant reached the container's spec.
func (b *bench) assertGranted(t *testing.T, id string) {
	t.Helper()
	spec, err := b.n.CRI.ContainerSpec(id)
	if err != nil {
		t.Fatalf("container %s: %v", id, err)
	}
	for _, d := range spec.Linux.Devices {
		for i := 0; i < b.wholeDevices; i++ {
			if d.Path == b.n.Devs.Path(i) {
				return
			}
		}
	}
	t.Fatalf("container %s asked for a device and its spec has none: %+v", id, spec.Linux.Devices)
}

// rss connects nri-accel and the template plugin together, starts `count` containers (the first
// ones asking for the node's exclusive devices) and reads both plugins' VmRSS and VmHWM.
func (b *bench) rss(t *testing.T, count int) []benchRSS {
	t.Helper()
	n := b.n
	n.Accel.Start(t)
	defer n.Accel.Stop()
	tp := b.startTemplate(t)
	defer tp.Stop()
	accelPid, tmplPid := n.Accel.cmd.Process.Pid, tp.cmd.Process.Pid
	out := []benchRSS{
		{Plugin: "nri-accel", Containers: count, IdleKiB: procStatusKiB(t, accelPid, "VmRSS")},
		{Plugin: "template", Containers: count, IdleKiB: procStatusKiB(t, tmplPid, "VmRSS")},
	}
	var pods []string
	for i := 0; i < count; i++ {
		_, pod, ctr := b.pod(t, fmt.Sprintf("bench-rss-%d", i), i < b.wholeDevices)
		if i < b.wholeDevices {
			b.assertGranted(t, ctr)
		}
		pods = append(pods, pod)
	}
	if ctrs, err := n.CRI.Containers(); err != nil || len(ctrs) != count {
		t.Fatalf("%d containers listed, want %d: %v", len(ctrs), count, err)
	}
	for i, pid := range []int{accelPid, tmplPid} {
		out[i].RSSKiB = procStatusKiB(t, pid, "VmRSS")
		out[i].HWMKiB = procStatusKiB(t, pid, "VmHWM")
	}
	for _, pod := range pods {
		if err := n.CRI.RemovePod(pod); err != nil {
			t.Fatalf("RemovePodSandbox: %v", err)
		}
	}
	return out
}

// goPlugin is an NRI plugin process the benchmark started (the template plugin).
type goPlugin struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

// startTemplate runs the template plugin as an external plugin on the node's NRI socket, with a
// log of its own, and waits until the runtime has synchronized it.
func (b *bench) startTemplate(t *testing.T) *goPlugin {
	t.Helper()
	b.starts++
	logPath := filepath.Join(b.n.Dir, fmt.Sprintf("template-%d.log", b.starts))
	log, err := os.Create(logPath)
	must(t, err)
	defer log.Close()
	cmd := exec.Command(b.template, "-name", "template", "-idx", "50", "-socket", b.n.RT.NRISocket())
	cmd.Stdout, cmd.Stderr = log, log
	must(t, cmd.Start())
	p := &goPlugin{cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	if !waitFor(30*time.Second, func() bool { return fileContains(logPath, "Synchronized state with the runtime") }) {
		p.Stop()
		t.Fatalf("the template plugin was not synchronized within 30 s:\n%s", tail(logPath, 20))
	}
	return p
}

// Stop stops the plugin (SIGTERM, then SIGKILL after 10 s).
func (p *goPlugin) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// enableMetrics adds a /metrics endpoint on a free loopback port to nri-accel's config and
// answers its URL.
func enableMetrics(t *testing.T, a *Accel) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := l.Addr().String()
	must(t, l.Close())
	f, err := os.OpenFile(a.Config, os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = fmt.Fprintf(f, "metrics:\n  listen: %q\n", addr)
	must(t, err)
	must(t, f.Close())
	return "http://" + addr + "/metrics"
}

// createHandlerTime reads nri-accel's CreateContainer histogram: its sum and count.
func (b *bench) createHandlerTime(t *testing.T) (time.Duration, int) {
	t.Helper()
	resp, err := http.Get(b.metrics)
	if err != nil {
		t.Fatalf("nri-accel's metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	var count int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `event="CreateContainer"`) {
			continue
		}
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "nri_accel_nri_event_duration_seconds_sum"):
			sum, _ = strconv.ParseFloat(f[len(f)-1], 64)
		case strings.HasPrefix(line, "nri_accel_nri_event_duration_seconds_count"):
			count, _ = strconv.Atoi(f[len(f)-1])
		}
	}
	if count == 0 {
		t.Fatalf("no CreateContainer in nri-accel's metrics at %s", b.metrics)
	}
	return time.Duration(sum * 1e9), count
}

// procStatusKiB reads a kB field (VmRSS, VmHWM) of /proc/<pid>/status.
func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kib, err := strconv.Atoi(f[1])
			must(t, err)
			return kib
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// percentile is the nearest-rank percentile p (0-100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

// benchTable is the report as Markdown: per configuration, p50 / p99 of each call in ms, then
// CreateContainer's p50 above the configuration without a plugin.
func benchTable(rep *benchReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "containerd %s (NRI %s), %d pods per configuration in rounds of %d, %d CPUs, load %s -> %s, %s\n\n",
		rep.Version, rep.NRI, rep.Pods, rep.Round, rep.CPUs, rep.LoadBefore, rep.LoadAfter, rep.Took.Round(time.Second))
	b.WriteString("| config | pods | CreateContainer p50 / p99 | no ask | device ask | RunPodSandbox | StartContainer |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, cfg := range benchConfigs {
		var create, plain, asks, run, start []time.Duration
		for _, s := range rep.Samples {
			if s.Config != cfg {
				continue
			}
			create, run, start = append(create, s.Create), append(run, s.Run), append(start, s.Start)
			if s.Ask {
				asks = append(asks, s.Create)
			} else {
				plain = append(plain, s.Create)
			}
		}
		pair := func(ds []time.Duration) string { return ms(percentile(ds, 50)) + " / " + ms(percentile(ds, 99)) }
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", cfg, len(create), pair(create), pair(plain), pair(asks), pair(run), pair(start))
	}
	b.WriteString("\nCreateContainer p50 difference, ms [95 % bootstrap interval]:")
	for _, pair := range [][2]string{{"template", "none"}, {"nri-accel", "none"}, {"nri-accel", "template"}} {
		for _, ask := range []bool{false, true} {
			d, lo, hi := medianDiff(creates(rep, pair[0], ask), creates(rep, pair[1], ask))
			fmt.Fprintf(&b, "\n  %s - %s, %s: %s [%s, %s]", pair[0], pair[1],
				map[bool]string{false: "no ask", true: "device ask"}[ask], ms(d), ms(lo), ms(hi))
		}
	}
	b.WriteString("\n")
	var plain, asks []time.Duration
	for _, s := range rep.Samples {
		if s.Config == "nri-accel" && s.Ask {
			asks = append(asks, s.Handler)
		} else if s.Config == "nri-accel" {
			plain = append(plain, s.Handler)
		}
	}
	fmt.Fprintf(&b, "\nnri-accel's own CreateContainer handler time p50 / p99 (ms): no ask %s / %s, device ask %s / %s\n",
		ms(percentile(plain, 50)), ms(percentile(plain, 99)), ms(percentile(asks, 50)), ms(percentile(asks, 99)))
	b.WriteString("\n| plugin | containers | VmRSS idle | VmRSS | VmHWM |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rep.RSS {
		fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %.1f MiB |\n", r.Plugin, r.Containers,
			float64(r.IdleKiB)/1024, float64(r.RSSKiB)/1024, float64(r.HWMKiB)/1024)
	}
	return b.String()
}

// creates are the CreateContainer latencies of configuration cfg's pods that ask (or not).
func creates(rep *benchReport, cfg string, ask bool) []time.Duration {
	var out []time.Duration
	for _, s := range rep.Samples {
		if s.Config == cfg && s.Ask == ask {
			out = append(out, s.Create)
		}
	}
	return out
}

// medianDiff is the difference of the medians of a and b with its 95 % bootstrap interval
// (2,000 resamples of each, fixed seed: a report, not a test).
func medianDiff(a, b []time.Duration) (d, lo, hi time.Duration) {
	if len(a) == 0 || len(b) == 0 {
		return 0, 0, 0
	}
	rng := rand.New(rand.NewPCG(26, 4))
	resample := func(xs []time.Duration) time.Duration {
		r := make([]time.Duration, len(xs))
		for i := range r {
			r[i] = xs[rng.IntN(len(xs))]
		}
		return percentile(r, 50)
	}
	diffs := make([]time.Duration, 2000)
	for i := range diffs {
		diffs[i] = resample(a) - resample(b)
	}
	sort.Slice(diffs, func(i, j int) bool { return diffs[i] < diffs[j] })
	return percentile(a, 50) - percentile(b, 50), diffs[len(diffs)*25/1000], diffs[len(diffs)*975/1000]
}
