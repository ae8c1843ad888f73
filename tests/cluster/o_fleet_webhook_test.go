package cluster

import (
	"encoding/json"
	"fmt"
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

	// The release's config, as the webhook's pod mounts it.
	cfg := str(c.getJSON(t, "get", "configmap", release, "-n", ns), "data", "config.yaml")
	h := c.startHostWebhook(t, "fleet-webhook", cfg, "-f", f.values)
	wh, url, caBundle, vwc := h.proc, h.url, h.caBundle, h.vwc
	defer wh.Stop(5 * time.Second)
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
