package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Scenario o, the webhook against the fleet: the chart's webhook (its RBAC and
// ValidatingWebhookConfiguration from `helm template`, roles.webhook with capacity slices) served
// by `nri-accel webhook` on the machine as scenario webhook_admission runs it (the apiserver cannot
// reach a Service's pods here: no kube-proxy), with the chart's config. With one device of each
// node's two held, a pod asking three devices (more than any node has) is refused, and one
// asking two (what a node has, though no node has them free now) is admitted.
func scenarioFleetWebhook(t *testing.T, f *fleet) {
	c := f.c
	const release, ns = "nri-accel", "nri-accel"
	c.apply(deploymentYAML("busy", len(c.Nodes), true))
	c.waitAppRunning(t, "busy", len(c.Nodes), 120*time.Second)
	defer func() {
		c.kubectl("delete", "deployment", "busy", "-n", "default")
		c.waitNoSpecs(t, 90*time.Second)
	}()

	ca, err := os.ReadFile(c.pki.CA)
	must(t, err)
	caBundle := base64.StdEncoding.EncodeToString(ca)
	tmpl, err := c.helm(t, "template", "--namespace", ns, release, chartDir(), "-f", f.values,
		"--set", "roles.webhook.enabled=true", "--set", "roles.webhook.caBundle="+caBundle)
	must(t, err)
	var rbac []obj
	var vwc obj
	for _, o := range yamlObjects(t, tmpl) {
		switch objName(o) {
		case "ServiceAccount/nri-accel-webhook", "ClusterRole/nri-accel-webhook", "ClusterRoleBinding/nri-accel-webhook":
			rbac = append(rbac, o)
		case "ValidatingWebhookConfiguration/nri-accel":
			vwc = o
		}
	}
	if len(rbac) != 3 || vwc == nil {
		t.Fatalf("the chart rendered %d of the webhook's RBAC objects and webhook configuration %v", len(rbac), vwc != nil)
	}
	if out, err := c.kubectlIn(jsonList(t, rbac), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the chart's webhook RBAC: %v\n%s", err, out)
	}
	token := strings.TrimSpace(c.kubectl("create", "token", "nri-accel-webhook", "-n", ns, "--duration", "1h"))
	kubeconfig := c.pki.tokenKubeconfig(t, "nri-accel-webhook", c.Server, token)
	// The release's config, as the webhook's pod mounts it, reaching the apiserver as the
	// webhook's service account.
	cfg := str(c.getJSON(t, "get", "configmap", release, "-n", ns), "data", "config.yaml")
	re := regexp.MustCompile(`(?m)^  kubeconfig: .*$`)
	if !re.MatchString(cfg) {
		t.Fatalf("no kubeconfig line in the release's config:\n%s", cfg)
	}
	dir := filepath.Join(c.Dir, "fleet-webhook")
	must(t, os.MkdirAll(filepath.Join(dir, "tls"), 0o755))
	whCfg := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(whCfg, []byte(re.ReplaceAllString(cfg, "  kubeconfig: "+kubeconfig)), 0o644))
	crt, key := c.pki.issue(t, "fleet-webhook", "nri-accel-webhook", nil, "127.0.0.1")
	for from, to := range map[string]string{crt: "tls.crt", key: "tls.key"} {
		b, err := os.ReadFile(from)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, "tls", to), b, 0o600))
	}
	wh := startProc(t, "nri-accel-webhook", filepath.Join(c.Dir, "nri-accel-fleet-webhook.log"), []string{"NRI_ACCEL_LOG=info"},
		accelBin(t), "--config", whCfg, "webhook", "--listen", "127.0.0.1:0", "--tls-dir", filepath.Join(dir, "tls"))
	defer wh.Stop(5 * time.Second)
	served := regexp.MustCompile(`nri-accel webhook: serving (https://127\.0\.0\.1:\d+/validate)`)
	var url string
	if !waitFor(30*time.Second, func() bool {
		b, _ := os.ReadFile(wh.Log)
		if m := served.FindSubmatch(b); m != nil {
			url = string(m[1])
		}
		return url != "" || !wh.Running()
	}) || url == "" {
		t.Fatalf("nri-accel webhook is not serving:\n%s", tail(wh.Log, 30))
	}
	hook := field(vwc, "webhooks", 0).(map[string]any)
	hook["clientConfig"] = obj{"url": url, "caBundle": caBundle}
	hook["failurePolicy"] = "Fail"
	b, err := json.Marshal(vwc)
	must(t, err)
	if out, err := c.kubectlIn(string(b), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the webhook configuration: %v\n%s", err, out)
	}
	defer c.kubectlErr("delete", "validatingwebhookconfiguration", release, "--ignore-not-found")

	tooMany := fmt.Sprintf("family=exclusive,count=%d", fleetWholeDevices+1)
	create := func(name, ask string) error {
		_, err := c.kubectlIn(webhookPodYAML(name, ask), "create", "--dry-run=server", "-f", "-")
		return err
	}
	// The apiserver picks up the configuration, and the webhook its first list of slices, a
	// moment later.
	waitFor(60*time.Second, func() bool {
		err := create("fleet-probe", tooMany)
		return err != nil && strings.Contains(err.Error(), "denied the request")
	})
	want := fmt.Sprintf("it asks %d units of pool whole but the pool's devices have at most %d", fleetWholeDevices+1, fleetWholeDevices)
	if err := create("fleet-too-many", tooMany); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a pod asking %s (each of %d nodes has %d devices) was not refused with %q: %v\nwebhook:\n%s",
			tooMany, len(c.Nodes), fleetWholeDevices, want, err, tail(wh.Log, 20))
	} else {
		t.Logf("refused: %v", err)
	}
	fits := fmt.Sprintf("family=exclusive,count=%d", fleetWholeDevices)
	if err := create("fleet-fits-one-node", fits); err != nil {
		t.Errorf("a pod asking %s (what one node has, though every node holds one device now) was refused: %v", fits, err)
	} else {
		t.Logf("admitted: %s, with one device held on each of %d nodes", fits, len(c.Nodes))
	}
}
