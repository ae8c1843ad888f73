package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Scenario k, the shipped dashboard and alert rules against a real Prometheus: nri-accel (metrics
// on loopback) runs inside real containerd, pods and claims go through it (grants, refusals at
// CreateContainer, claims-API prepares ok and refused, unprepares), Prometheus (Debian's) scrapes
// it every second with packaging/prometheus/nri-accel-rules.yaml loaded, and then every query of
// every panel of packaging/grafana/nri-accel.json returns data, every rule evaluates without
// error, and no alert fires on this healthy node. Run by packaging/prometheus/check.sh
// (NRI_ACCEL_E2E_DASHBOARD=1); with NRI_ACCEL_E2E_DASHBOARD_OUT=<dir> it also writes every
// panel's series over the run to <dir>/dashboard-data.json (the docs' plot is drawn from it).
func TestK_DashboardQueriesHaveData(t *testing.T) {
	if os.Getenv("NRI_ACCEL_E2E_DASHBOARD") != "1" {
		t.Skip("SKIPPED: the dashboard check runs from packaging/prometheus/check.sh (NRI_ACCEL_E2E_DASHBOARD=1); it needs Debian's prometheus")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("no prometheus binary: apt-get install prometheus (packaging/prometheus/check.sh does)")
	}
	repo := filepath.Join(testsDir(), "..")
	eachVersion(t, func(t *testing.T, v string) {
		if isCrio(v) {
			t.Skip("SKIPPED: the dashboard check runs on containerd")
		}
		n := startNode(t, v, modes(v)[0], NodeOptions{NoAccel: true})
		metricsPort := freePort(t)
		f, err := os.OpenFile(n.Accel.Config, os.O_APPEND|os.O_WRONLY, 0)
		must(t, err)
		_, err = fmt.Fprintf(f, "metrics:\n  listen: 127.0.0.1:%d\n", metricsPort)
		must(t, err)
		must(t, f.Close())
		n.Accel.Start(t)

		prom := startPrometheus(t, promBin, n.Dir, metricsPort, filepath.Join(repo, "packaging", "prometheus", "nri-accel-rules.yaml"))
		start := time.Now()

		// The workload: each round a pod holds accel0, a second asking for it is refused at
		// CreateContainer, the claims API prepares a share and refuses an impossible ask,
		// then everything is released.
		for round := 0; round < 4; round++ {
			holder := n.mustRunPod(t, fmt.Sprintf("holder-%d", round), annotation("app", exclusiveAsk))
			n.mustRun(t, holder, "app")
			refused := n.mustRunPod(t, fmt.Sprintf("refused-%d", round), annotation("app", exclusiveAsk))
			if _, err := n.CRI.Run(refused, "app"); err == nil {
				t.Fatalf("round %d: a second pod got the held device", round)
			}
			uid := fmt.Sprintf("dash-%d", round)
			if _, errs, err := n.Accel.CLI("prepare", uid, "--family", "shared"); err != nil {
				t.Fatalf("prepare %s: %v: %s", uid, err, errs)
			}
			if _, _, err := n.Accel.CLI("prepare", uid+"-big", "--count", "5"); err == nil {
				t.Fatal("a prepare of 5 exclusive devices on a node of 1 was not refused")
			}
			time.Sleep(3 * time.Second)
			if _, errs, err := n.Accel.CLI("unprepare", uid); err != nil {
				t.Fatalf("unprepare %s: %v: %s", uid, err, errs)
			}
			must(t, n.CRI.RemovePod(holder.ID))
			must(t, n.CRI.RemovePod(refused.ID))
			time.Sleep(3 * time.Second)
		}
		time.Sleep(3 * time.Second) // a few more scrapes after the last change
		end := time.Now()

		var dash struct {
			Panels []struct {
				Title       string `json:"title"`
				FieldConfig struct {
					Defaults struct {
						Unit string `json:"unit"`
					} `json:"defaults"`
				} `json:"fieldConfig"`
				Targets []struct {
					Expr   string `json:"expr"`
					Legend string `json:"legendFormat"`
				} `json:"targets"`
			} `json:"panels"`
		}
		raw, err := os.ReadFile(filepath.Join(repo, "packaging", "grafana", "nri-accel.json"))
		must(t, err)
		must(t, json.Unmarshal(raw, &dash))
		if len(dash.Panels) == 0 {
			t.Fatal("the dashboard has no panels")
		}
		type series struct {
			Labels map[string]string `json:"labels"`
			Legend string            `json:"legend"`
			Points [][2]float64      `json:"points"`
		}
		type panelData struct {
			Title  string   `json:"title"`
			Unit   string   `json:"unit"`
			Series []series `json:"series"`
		}
		var plot []panelData
		for _, p := range dash.Panels {
			pd := panelData{Title: p.Title, Unit: p.FieldConfig.Defaults.Unit}
			for _, tg := range p.Targets {
				expr := strings.ReplaceAll(tg.Expr, "$instance", ".*")
				var instant []struct {
					Metric map[string]string `json:"metric"`
				}
				prom.query(t, "query", url.Values{"query": {expr}}, &instant)
				if len(instant) == 0 {
					t.Errorf("panel %q: %s returned no data", p.Title, expr)
				}
				var ranged []struct {
					Metric map[string]string `json:"metric"`
					Values [][2]any          `json:"values"`
				}
				prom.query(t, "query_range", url.Values{"query": {expr},
					"start": {fmt.Sprint(start.Unix())}, "end": {fmt.Sprint(end.Unix())}, "step": {"1"}}, &ranged)
				for _, r := range ranged {
					s := series{Labels: r.Metric, Legend: legend(tg.Legend, r.Metric)}
					for _, v := range r.Values {
						ts, _ := v[0].(float64)
						var val float64
						fmt.Sscan(fmt.Sprint(v[1]), &val)
						if math.IsNaN(val) || math.IsInf(val, 0) {
							continue // a quantile of no events: no point, as Grafana draws it
						}
						s.Points = append(s.Points, [2]float64{ts - float64(start.Unix()), val})
					}
					pd.Series = append(pd.Series, s)
				}
			}
			plot = append(plot, pd)
		}

		// The rules loaded and evaluate without error; none fires on this healthy node.
		var rules struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					State     string `json:"state"`
				} `json:"rules"`
			} `json:"groups"`
		}
		prom.query(t, "rules", nil, &rules)
		count := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				count++
				if r.Health != "ok" {
					t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
				}
				if r.State == "firing" || r.State == "pending" {
					t.Errorf("alert %s is %s on a healthy node", r.Name, r.State)
				}
			}
		}
		if count == 0 {
			t.Error("Prometheus loaded no rule from packaging/prometheus/nri-accel-rules.yaml")
		}
		t.Logf("%d panels, %d rules checked against a real Prometheus over %s", len(dash.Panels), count, end.Sub(start).Round(time.Second))

		if out := os.Getenv("NRI_ACCEL_E2E_DASHBOARD_OUT"); out != "" {
			b, err := json.MarshalIndent(plot, "", " ")
			must(t, err)
			must(t, os.MkdirAll(out, 0o755))
			must(t, os.WriteFile(filepath.Join(out, "dashboard-data.json"), b, 0o644))
		}
	})
}

// legend fills a Grafana legend format ({{label}}) from a series' labels.
func legend(format string, labels map[string]string) string {
	for k, v := range labels {
		format = strings.ReplaceAll(format, "{{"+k+"}}", v)
	}
	return format
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type prometheus struct {
	addr string
	process
}

// startPrometheus runs Prometheus under dir scraping 127.0.0.1:<target> every second (job
// nri-accel) with the rules file loaded, and waits until it is ready and has scraped once.
func startPrometheus(t *testing.T, bin, dir string, target int, rules string) *prometheus {
	t.Helper()
	pdir := filepath.Join(dir, "prometheus")
	must(t, os.MkdirAll(pdir, 0o755))
	conf := filepath.Join(pdir, "prometheus.yml")
	must(t, os.WriteFile(conf, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: nri-accel
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, rules, target)), 0o644))
	p := &prometheus{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cmd := exec.Command(bin, "--config.file", conf, "--storage.tsdb.path", filepath.Join(pdir, "data"),
		"--web.listen-address", p.addr)
	p.start(t, cmd, filepath.Join(pdir, "prometheus.log"), "prometheus")
	t.Cleanup(func() {
		p.stop(10*time.Second, nil)
		if t.Failed() {
			res := resultsDir(t)
			_ = os.MkdirAll(res, 0o755)
			_ = exec.Command("cp", filepath.Join(pdir, "prometheus.log"), conf, res).Run()
		}
	})
	if !waitFor(60*time.Second, func() bool {
		var up []any
		return p.tryQuery("query", url.Values{"query": {`up{job="nri-accel"} == 1`}}, &up) == nil && len(up) == 1
	}) {
		t.Fatalf("Prometheus did not come up and scrape nri-accel within 60 s:\n%s", tail(filepath.Join(pdir, "prometheus.log"), 20))
	}
	return p
}

// query calls /api/v1/<api> and decodes its data (the result of a query) into out.
func (p *prometheus) query(t *testing.T, api string, params url.Values, out any) {
	t.Helper()
	if err := p.tryQuery(api, params, out); err != nil {
		t.Fatalf("Prometheus %s %v: %v", api, params, err)
	}
}

func (p *prometheus) tryQuery(api string, params url.Values, out any) error {
	u := "http://" + p.addr + "/api/v1/" + api
	if params != nil {
		u += "?" + params.Encode()
	}
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %v: %s", u, err, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", u, env.Error)
	}
	if strings.HasPrefix(api, "query") {
		var d struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(env.Data, &d); err != nil {
			return err
		}
		return json.Unmarshal(d.Result, out)
	}
	return json.Unmarshal(env.Data, out)
}
