package cluster

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClusterBench measures what a DRA claim adds to a pod's start on the real cluster (issue 29
// item 5): pods with one claim from a ResourceClaimTemplate on accel-gpu and the same pods without
// claims, created one at a time, alternating, each deleted (and its claim released) before the
// next; the time from the create request to the first watch event that shows the pod Running;
// and the kubelet's own DRA histograms over the same pods (PrepareResources as its DRA manager
// measures it, and the NodePrepareResources gRPC call). It asserts no times: it prints them
// (tests/README.md, "The cluster benchmark"; docs/performance.md). Skipped unless
// NRI_ACCEL_CLUSTER_BENCH=1; NRI_ACCEL_CLUSTER_BENCH_PODS sets the pods per kind (default 50).
func TestClusterBench(t *testing.T) {
	if os.Getenv("NRI_ACCEL_CLUSTER_BENCH") != "1" {
		t.Skip("SKIPPED: the cluster benchmark runs with NRI_ACCEL_CLUSTER_BENCH=1 (tests/README.md, \"The cluster benchmark\")")
	}
	requireRoot(t)
	n := 50
	if s := os.Getenv("NRI_ACCEL_CLUSTER_BENCH_PODS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("NRI_ACCEL_CLUSTER_BENCH_PODS=%q is not a positive number", s)
		}
		n = v
	}
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) { benchVersion(t, v, n) })
	}
}

// apiClient is an HTTPS client of the cluster's apiserver and kubelet, with a client
// certificate of the cluster's CA in system:masters.
type apiClient struct {
	c    *Cluster
	http *http.Client
}

func (c *Cluster) newAPIClient(t *testing.T) *apiClient {
	t.Helper()
	certPath, keyPath := c.pki.issue(t, "bench", "nri-accel-bench", []string{"system:masters"})
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	must(t, err)
	ca, err := os.ReadFile(c.pki.CA)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &apiClient{c: c, http: &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}}
}

// do sends a request to the apiserver and answers the body of a 2xx answer.
func (a *apiClient) do(method, path, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequest(method, a.c.Server+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return b, err
}

// podEvent is what the pod watch saw of one pod, and when it got there.
type podEvent struct {
	name, phase string
	deleted     bool
	at          time.Time
}

// podWatch follows the pods of namespace default from one watch, stamping each event as it
// arrives.
type podWatch struct {
	mu     sync.Mutex
	events []podEvent
	err    error
	body   io.Closer
}

func (a *apiClient) watchPods(t *testing.T) *podWatch {
	t.Helper()
	b, err := a.do("GET", "/api/v1/namespaces/default/pods", "", nil)
	must(t, err)
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	must(t, json.Unmarshal(b, &l))
	req, err := http.NewRequest("GET", a.c.Server+"/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=false&resourceVersion="+l.Metadata.ResourceVersion, nil)
	must(t, err)
	resp, err := a.http.Do(req)
	must(t, err)
	if resp.StatusCode != 200 {
		t.Fatalf("watching pods: %s", resp.Status)
	}
	w := &podWatch{body: resp.Body}
	go func() {
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var ev struct {
				Type   string `json:"type"`
				Object struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
					Status struct {
						Phase string `json:"phase"`
					} `json:"status"`
				} `json:"object"`
			}
			err := dec.Decode(&ev)
			now := time.Now()
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.events = append(w.events, podEvent{name: ev.Object.Metadata.Name, phase: ev.Object.Status.Phase,
				deleted: ev.Type == "DELETED", at: now})
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return w
}

// first answers the first event of pod name that cond accepts.
func (w *podWatch) first(name string, cond func(podEvent) bool) (podEvent, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.events {
		if e.name == name && cond(e) {
			return e, true, nil
		}
	}
	return podEvent{}, false, w.err
}

// waitEvent waits up to `within` for an event of pod name that cond accepts.
func (w *podWatch) waitEvent(t *testing.T, name, what string, within time.Duration, cond func(podEvent) bool) podEvent {
	t.Helper()
	var e podEvent
	var err error
	if !waitFor(within, func() bool {
		var ok bool
		e, ok, err = w.first(name, cond)
		return ok || err != nil
	}) || err != nil {
		t.Fatalf("the pod watch showed no %s of %s within %s (watch error: %v)", what, name, within, err)
	}
	return e
}

// benchPod creates pod `name` (a claim from template one-gpu when dra), waits until the watch
// shows it Running and answers the time from the create request to that event; then deletes it
// and waits until it is gone and nri-accel holds no claim.
func (a *apiClient) benchPod(t *testing.T, w *podWatch, name string, dra bool) time.Duration {
	t.Helper()
	template := ""
	if dra {
		template = "one-gpu"
	}
	body := []byte(podYAML(name, template))
	start := time.Now()
	if _, err := a.do("POST", "/api/v1/namespaces/default/pods", "application/yaml", body); err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	running := w.waitEvent(t, name, "Running", 120*time.Second, func(e podEvent) bool { return e.phase == "Running" })
	took := running.at.Sub(start)
	if _, err := a.do("DELETE", "/api/v1/namespaces/default/pods/"+name, "", nil); err != nil {
		t.Fatalf("deleting %s: %v", name, err)
	}
	w.waitEvent(t, name, "deletion", 120*time.Second, func(e podEvent) bool { return e.deleted })
	if dra && !waitFor(60*time.Second, func() bool { return len(a.c.accelClaims(t)) == 0 }) {
		t.Fatalf("nri-accel still holds %v after %s was deleted", a.c.accelClaims(t), name)
	}
	return took
}

// histogram is one Prometheus histogram series: cumulative bucket counts by upper bound.
type histogram struct {
	le    []float64
	cum   []float64
	sum   float64
	count float64
}

// scrapeHistograms reads the kubelet's /metrics and answers the series of histogram `name`
// whose labels contain every one of `match` (a series is keyed by its labels without le).
func (a *apiClient) scrapeHistograms(t *testing.T, name string, match ...string) map[string]*histogram {
	t.Helper()
	resp, err := a.http.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", a.c.KubeletPort))
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the kubelet's /metrics: %s", resp.Status)
	}
	out := map[string]*histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_") {
			continue
		}
		metric, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			continue
		}
		suffix, labels, _ := strings.Cut(strings.TrimPrefix(metric, name+"_"), "{")
		labels = strings.TrimSuffix(labels, "}")
		skip := false
		for _, m := range match {
			if !strings.Contains(labels, m) {
				skip = true
			}
		}
		if skip {
			continue
		}
		var key []string
		le := math.NaN()
		for _, l := range strings.Split(labels, ",") {
			if k, val, ok := strings.Cut(l, "="); ok && k == "le" {
				if le, err = strconv.ParseFloat(strings.Trim(val, `"`), 64); err != nil {
					le = math.Inf(1)
				}
				continue
			}
			key = append(key, l)
		}
		k := strings.Join(key, ",")
		h := out[k]
		if h == nil {
			h = &histogram{}
			out[k] = h
		}
		switch suffix {
		case "bucket":
			h.le = append(h.le, le)
			h.cum = append(h.cum, v)
		case "sum":
			h.sum = v
		case "count":
			h.count = v
		}
	}
	must(t, sc.Err())
	return out
}

// merged adds up every series of hs minus the same series of before (what happened in between).
func merged(hs, before map[string]*histogram) *histogram {
	var out *histogram
	for k, h := range hs {
		d := &histogram{le: h.le, cum: append([]float64(nil), h.cum...), sum: h.sum, count: h.count}
		if b := before[k]; b != nil && len(b.cum) == len(d.cum) {
			for i := range d.cum {
				d.cum[i] -= b.cum[i]
			}
			d.sum -= b.sum
			d.count -= b.count
		}
		if out == nil {
			out = d
			continue
		}
		for i := range out.cum {
			if i < len(d.cum) {
				out.cum[i] += d.cum[i]
			}
		}
		out.sum += d.sum
		out.count += d.count
	}
	return out
}

// quantile estimates quantile q of h by linear interpolation inside its bucket, as Prometheus'
// histogram_quantile does (from 0 in the first bucket).
func (h *histogram) quantile(q float64) float64 {
	if h == nil || h.count == 0 {
		return math.NaN()
	}
	rank := q * h.count
	prevLe, prevCum := 0.0, 0.0
	for i, le := range h.le {
		if h.cum[i] >= rank {
			if math.IsInf(le, 1) {
				return prevLe
			}
			if h.cum[i] == prevCum {
				return le
			}
			return prevLe + (le-prevLe)*(rank-prevCum)/(h.cum[i]-prevCum)
		}
		prevLe, prevCum = le, h.cum[i]
	}
	return prevLe
}

// describe says a histogram's count and mean, and its p50 and p99: estimated from the buckets,
// or, when every observation fell in the first bucket, only that bound (the kubelet's DRA
// buckets start at 100 ms).
func (h *histogram) describe() string {
	if h == nil || h.count == 0 {
		return "no observations"
	}
	mean := fmt.Sprintf("%.0f observations, mean %.1f ms", h.count, 1000*h.sum/h.count)
	if len(h.cum) > 0 && h.cum[0] == h.count {
		return fmt.Sprintf("%s, all <= %.0f ms (the first bucket)", mean, 1000*h.le[0])
	}
	return fmt.Sprintf("%s, p50 ~%.0f ms, p99 ~%.0f ms (estimated from the buckets)", mean, 1000*h.quantile(0.5), 1000*h.quantile(0.99))
}

// percentile answers the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	if i < 0 {
		i = 0
	}
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func benchVersion(t *testing.T, v string, n int) {
	c := Start(t, v, Options{})
	c.applyTemplate(t, "one-gpu", "accel-gpu")
	a := c.newAPIClient(t)
	w := a.watchPods(t)
	// One of each first, not counted: the first pod of a kind pays for what later ones reuse.
	a.benchPod(t, w, "bench-warm-dra", true)
	a.benchPod(t, w, "bench-warm-plain", false)
	const opMetric, grpcMetric = "dra_operations_duration_seconds", "dra_grpc_operations_duration_seconds"
	opBefore := a.scrapeHistograms(t, opMetric, `operation_name="PrepareResources"`)
	grpcBefore := a.scrapeHistograms(t, grpcMetric, `driver_name="accel.nri.io"`, "NodePrepareResources")
	loadBefore := loadavg()
	begin := time.Now()
	var dra, plain []time.Duration
	for i := 0; i < n; i++ {
		// Alternate which kind goes first, so that neither always follows the other's deletion.
		kinds := []bool{true, false}
		if i%2 == 1 {
			kinds = []bool{false, true}
		}
		for _, isDRA := range kinds {
			if isDRA {
				dra = append(dra, a.benchPod(t, w, fmt.Sprintf("bench-dra-%d", i), true))
			} else {
				plain = append(plain, a.benchPod(t, w, fmt.Sprintf("bench-plain-%d", i), false))
			}
		}
	}
	elapsed := time.Since(begin)
	op := merged(a.scrapeHistograms(t, opMetric, `operation_name="PrepareResources"`), opBefore)
	grpc := merged(a.scrapeHistograms(t, grpcMetric, `driver_name="accel.nri.io"`, "NodePrepareResources"), grpcBefore)
	var b strings.Builder
	fmt.Fprintf(&b, "cluster benchmark, Kubernetes %s, %d pods per kind, one at a time, in %.0f s; load average %s before, %s after\n",
		v, n, elapsed.Seconds(), loadBefore, loadavg())
	fmt.Fprintf(&b, "create -> Running    p50       p90       p99       max\n")
	for _, k := range []struct {
		name string
		ds   []time.Duration
	}{{"with a DRA claim", dra}, {"without claims", plain}} {
		fmt.Fprintf(&b, "%-20s %-9s %-9s %-9s %s\n", k.name, ms(percentile(k.ds, 50)), ms(percentile(k.ds, 90)),
			ms(percentile(k.ds, 99)), ms(percentile(k.ds, 100)))
	}
	fmt.Fprintf(&b, "DRA minus plain: p50 %+.0f ms, p99 %+.0f ms (goal: p50 within 500 ms)\n",
		float64(percentile(dra, 50)-percentile(plain, 50))/float64(time.Millisecond),
		float64(percentile(dra, 99)-percentile(plain, 99))/float64(time.Millisecond))
	// The kubelet's DRA manager runs PrepareResources for every pod it admits, those without
	// claims too (nothing to do there: microseconds), so its sum is the DRA pods' time.
	perPod := math.NaN()
	if op != nil {
		perPod = 1000 * op.sum / float64(n)
	}
	fmt.Fprintf(&b, "kubelet %s{operation_name=PrepareResources}, every pod admitted: %s; its sum per DRA pod %.1f ms\n",
		opMetric, op.describe(), perPod)
	fmt.Fprintf(&b, "kubelet %s{driver_name=accel.nri.io, NodePrepareResources}: %s\n", grpcMetric, grpc.describe())
	t.Log("\n" + b.String())
}
