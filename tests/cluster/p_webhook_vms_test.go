package cluster

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The webhook's judgement of DRA claims and KubeVirt VMs against the real apiserver (issue 36
// item 4), run inside scenarioWebhook while its webhook serves. KubeVirt's modules are not
// served by this machine's module proxy, so the VirtualMachineInstance CRD applied here is a
// stand-in carrying KubeVirt's group, version, names and scope with an open schema; the VMIs are
// written with KubeVirt's field names (spec.resourceClaims, domain.devices.gpus[] with claimName
// and requestName, or deviceName). Proven:
//   - the chart's VMI rule follows the cluster: off before the CRD exists, on after (helm
//     install --dry-run=server renders with the server's API versions; roles.webhook.kubevirt:
//     auto);
//   - a pod whose claim template asks more devices of class accel-gpu than any node publishes is
//     refused at create with the sentence naming the template, request, class and the most a node
//     has; one asking what fits is admitted; two claims that fit alone but not together on one
//     node are refused;
//   - a VMI asking through a claim request, or by device plugin resource name, more than any node
//     has is refused with its sentence; one that fits is admitted.
func webhookDRAandVMs(t *testing.T, c *Cluster, url, caBundle string) {
	// A server-side dry run renders with the server's API versions (helm's .Capabilities), as
	// an install on this cluster would; its configuration then replaces scenarioWebhook's.
	const release, dry = "nri-accel", "nri-accel-vmcheck"
	c.kubectlErr("create", "namespace", dry)
	render := func() obj {
		out, err := c.helm(t, "install", "--dry-run=server", "-o", "json", "--namespace", dry, dry, chartDir(),
			"--set", "roles.webhook.enabled=true", "--set", "roles.webhook.caBundle="+caBundle)
		must(t, err)
		var rel obj
		must(t, json.Unmarshal([]byte(out), &rel))
		for _, o := range yamlObjects(t, str(rel, "manifest")) {
			if objName(o) == "ValidatingWebhookConfiguration/"+dry {
				o["metadata"].(map[string]any)["name"] = release
				return o
			}
		}
		t.Fatalf("the chart rendered no ValidatingWebhookConfiguration")
		return nil
	}
	hooks := func(o obj) []string {
		var names []string
		for _, h := range list(o, "webhooks") {
			names = append(names, str(h, "name"))
		}
		return names
	}
	if got := hooks(render()); len(got) != 1 {
		t.Errorf("without KubeVirt's CRD the chart rendered webhooks %v; want pods.accel.nri.io alone", got)
	}
	c.apply(vmiCRD)
	defer c.kubectlErr("delete", "crd", "virtualmachineinstances.kubevirt.io", "--ignore-not-found", "--wait=false")
	c.kubectl("wait", "--for=condition=Established", "crd/virtualmachineinstances.kubevirt.io", "--timeout=60s")
	vwc := render()
	if got := hooks(vwc); len(got) != 2 || got[1] != "vmis.accel.nri.io" {
		t.Fatalf("with KubeVirt's CRD served the chart rendered webhooks %v; want pods and vmis", got)
	}
	for _, h := range list(vwc, "webhooks") {
		h.(map[string]any)["clientConfig"] = obj{"url": url, "caBundle": caBundle}
	}
	b, err := json.Marshal(vwc)
	must(t, err)
	if out, err := c.kubectlIn(string(b), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the webhook configuration with the VMI rule: %v\n%s", err, out)
	}

	// The shipped DeviceClasses (scenario helm_dry_run_server deleted them for its install),
	// applied after the dry runs above, which would find them owned by no release.
	classes := filepath.Join(testsDir(), "..", "packaging", "kubernetes", "deviceclasses.yaml")
	c.kubectl("apply", "-f", classes)

	// What one node has for class accel-gpu: the claims are sized from it.
	most := 0
	for _, s := range list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items") {
		n := 0
		for _, d := range list(s, "spec", "devices") {
			if str(d, "attributes", "type", "string") == "device" && str(d, "attributes", "family", "string") == "exclusive" {
				n++
			}
		}
		most = max(most, n)
	}
	if most == 0 {
		t.Fatalf("the node publishes no whole device of the exclusive family")
	}
	tooMany, fits := most+1, most
	for name, count := range map[string]int{"wh-too-many": tooMany, "wh-fits": fits, "wh-one": 1} {
		c.apply(claimTemplateYAML(name, strings.Replace(oneDevice("accel-gpu", "", ""), "count: 1", fmt.Sprintf("count: %d", count), 1)))
		defer c.kubectlErr("delete", "resourceclaimtemplate", name, "-n", "default", "--ignore-not-found")
	}
	dryRun := func(yaml string) error {
		out, err := c.kubectlIn(yaml, "create", "--dry-run=server", "-f", "-")
		if err == nil && strings.Contains(out, "Warning") {
			t.Logf("admitted with: %s", out)
		}
		return err
	}
	// The apiserver and the webhook's next read of classes and slices catch up: wait for the
	// first refusal.
	waitFor(60*time.Second, func() bool { return dryRun(claimPodYAML("wh-probe", "wh-too-many")) != nil })
	want := fmt.Sprintf(`admission webhook "pods.accel.nri.io" denied the request: claim template default/wh-too-many (pod claim gpu) request gpu: asks for %d devices of class accel-gpu, but the most any node publishes is %d (node %s); ask for at most %d`,
		tooMany, most, nodeName, most)
	if err := dryRun(claimPodYAML("wh-pod-too-many", "wh-too-many")); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a pod whose claim asks %d devices (a node has %d): got %v, want\n  %s", tooMany, most, err, want)
	} else {
		t.Logf("refused: %s", err)
	}
	if err := dryRun(claimPodYAML("wh-pod-fits", "wh-fits")); err != nil {
		t.Errorf("a pod whose claim asks %d devices (a node has %d) was refused: %v", fits, most, err)
	}
	two := strings.Replace(claimPodYAML("wh-pod-two", "wh-fits"), "  resourceClaims:\n",
		"  resourceClaims:\n    - {name: more, resourceClaimTemplateName: wh-one}\n", 1)
	if err := dryRun(two); err == nil || !strings.Contains(err.Error(), "no one node can serve all its claims together") {
		t.Errorf("a pod whose two claims fit alone but not together was not refused for it: %v", err)
	} else {
		t.Logf("refused: %s", err)
	}

	// VMIs: by claim request, and by device plugin resource name.
	if err := dryRun(vmiYAML("wh-vm-too-many", "wh-too-many", 0)); err == nil ||
		!strings.Contains(err.Error(), `admission webhook "vmis.accel.nri.io" denied the request: claim template default/wh-too-many (pod claim gpus) request gpu: asks for`) {
		t.Errorf("a VMI whose claim asks %d devices was not refused with the claim's sentence: %v", tooMany, err)
	} else {
		t.Logf("refused: %s", err)
	}
	if err := dryRun(vmiYAML("wh-vm-fits", "wh-fits", 0)); err != nil {
		t.Errorf("a VMI whose claim fits a node was refused: %v", err)
	}
	wantVM := fmt.Sprintf("VMI default/wh-vm-names asks for %d devices of resource accel.nri.io/whole, but the most any node has in pool whole is %d (node %s)", tooMany, most, nodeName)
	if err := dryRun(vmiYAML("wh-vm-names", "", tooMany)); err == nil || !strings.Contains(err.Error(), wantVM) {
		t.Errorf("a VMI asking %d devices of accel.nri.io/whole: got %v, want\n  %s", tooMany, err, wantVM)
	} else {
		t.Logf("refused: %s", err)
	}
	if err := dryRun(vmiYAML("wh-vm-one", "", 1)); err != nil {
		t.Errorf("a VMI asking one device of accel.nri.io/whole was refused: %v", err)
	}
}

// vmiCRD stands in for KubeVirt's VirtualMachineInstance CRD: KubeVirt's group, version, kind,
// names and scope, with a schema that keeps every field (KubeVirt's own schema is generated in
// its repository, whose modules this machine cannot fetch).
const vmiCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: virtualmachineinstances.kubevirt.io}
spec:
  group: kubevirt.io
  scope: Namespaced
  names: {kind: VirtualMachineInstance, listKind: VirtualMachineInstanceList, plural: virtualmachineinstances, singular: virtualmachineinstance, shortNames: [vmi, vmis]}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// claimPodYAML is a pod in namespace default with one claim `gpu` from template; it never runs
// (only its admission matters).
func claimPodYAML(name, template string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  automountServiceAccountToken: false
  nodeSelector: {nri-accel.test/never: "true"}
  resourceClaims:
    - {name: gpu, resourceClaimTemplateName: %s}
  containers:
    - name: app
      image: %s
      command: [sleep, "1"]
      resources: {claims: [{name: gpu}]}
`, name, template, imageRef)
}

// vmiYAML is a VMI in namespace default asking a GPU through claim `gpus` from template (when
// set), or `byName` GPUs of device plugin resource accel.nri.io/whole.
func vmiYAML(name, template string, byName int) string {
	claims, gpus := "[]", ""
	if template != "" {
		claims = fmt.Sprintf("[{name: gpus, resourceClaimTemplateName: %s}]", template)
		gpus += "        - {name: gpu0, claimName: gpus, requestName: gpu}\n"
	}
	for i := 0; i < byName; i++ {
		gpus += fmt.Sprintf("        - {name: whole%d, deviceName: accel.nri.io/whole}\n", i)
	}
	return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: %s, namespace: default}
spec:
  resourceClaims: %s
  domain:
    resources: {requests: {memory: 128Mi}}
    devices:
      gpus:
%s`, name, claims, gpus)
}
