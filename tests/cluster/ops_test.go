package cluster

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The peer helm is built from (tests/peers/helm-v4.3.2).
const helmPeer = "helm-v4.3.2"

// TestClusterOps checks what an operator deploys against the real apiserver of one cluster per
// version (issue 30): the Helm chart (helm_dry_run_server) and the admission webhook
// (webhook_admission). tests/README.md, "The cluster suite", says what each proves.
func TestClusterOps(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{})
			runScenarios(t, c, false,
				scenario{"helm_dry_run_server", scenarioHelmDryRun},
				scenario{"webhook_admission", scenarioWebhook},
			)
		})
	}
}

func chartDir() string { return filepath.Join(testsDir(), "..", "packaging", "helm", "nri-accel") }

// helm runs the peer's helm against the cluster as its admin: stdout, and an error with stderr.
func (c *Cluster) helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(buildPeer(t, helmPeer), "helm")
	tmp := t.TempDir()
	recordRun(append([]string{"helm"}, args...)...)
	cmd := exec.Command(bin, append(args, "--kubeconfig", c.Admin)...)
	// helm keeps caches and config under $HOME; keep them out of the machine's.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp, "HELM_CONFIG_HOME="+tmp, "HELM_DATA_HOME="+tmp)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// yamlObjects decodes a multi-document manifest into its objects (empty documents left out).
func yamlObjects(t *testing.T, manifest string) []obj {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(manifest))
	var out []obj
	for {
		var o obj
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		must(t, err)
		if len(o) > 0 {
			out = append(out, o)
		}
	}
}

func objName(o obj) string { return str(o, "kind") + "/" + str(o, "metadata", "name") }

// jsonList is the objects as a v1 List kubectl reads from stdin.
func jsonList(t *testing.T, objs []obj) string {
	t.Helper()
	b, err := json.Marshal(obj{"apiVersion": "v1", "kind": "List", "items": objs})
	must(t, err)
	return string(b)
}

// Scenario: the chart against the real apiserver. `helm install --dry-run=server` of
// packaging/helm/nri-accel (default values; the webhook role with a caBundle) succeeds and the
// release it prints holds exactly the chart's objects (helm template's, object for object). helm's
// dry run checks the objects against the server's OpenAPI schema and for conflicts with what is
// there, but sends none of them to be admitted; so the same manifest is then applied with
// `kubectl apply --server-side --dry-run=server`, where the apiserver validates every object for
// real (DeviceClass selectors, the ValidatingAdmissionPolicy's and the webhook's matchConditions
// CEL compiled). A control with a broken matchConditions expression must be refused there.
func scenarioHelmDryRun(t *testing.T, c *Cluster) {
	// The cluster carries packaging/kubernetes applied with kubectl; its DeviceClasses have the
	// chart's names and no Helm owner, so helm would (rightly) refuse to take them over.
	if out, err := c.kubectlErr("delete", "-f", filepath.Join(testsDir(), "..", "packaging", "kubernetes", "deviceclasses.yaml")); err != nil {
		t.Fatalf("deleting the plain manifests' DeviceClasses: %v\n%s", err, out)
	}
	const ns, release = "nri-accel-helm", "nri-accel-helm"
	c.kubectl("create", "namespace", ns)
	ca, err := os.ReadFile(c.pki.CA)
	must(t, err)
	caBundle := base64.StdEncoding.EncodeToString(ca)
	for _, tc := range []struct {
		name string
		args []string
		want []string // objects the manifest must hold (beside the others)
	}{
		{"default", nil, []string{"DaemonSet/" + release, "DeviceClass/accel-gpu", "ValidatingAdmissionPolicy/" + release + "-resourceslices-own-node"}},
		{"webhook", []string{"--set", "roles.webhook.enabled=true", "--set", "roles.webhook.caBundle=" + caBundle},
			[]string{"Deployment/" + release + "-webhook", "ValidatingWebhookConfiguration/" + release, "ClusterRole/" + release + "-webhook"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			begin := time.Now()
			out, err := c.helm(t, append([]string{"install", "--dry-run=server", "-o", "json", "--namespace", ns, release, chartDir()}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var rel obj
			must(t, json.Unmarshal([]byte(out), &rel))
			if d := str(rel, "info", "description"); d != "Dry run complete" {
				t.Errorf("helm's release says %q, want a complete dry run", d)
			}
			got := yamlObjects(t, str(rel, "manifest"))
			tmpl, err := c.helm(t, append([]string{"template", "--namespace", ns, release, chartDir()}, tc.args...)...)
			must(t, err)
			want := yamlObjects(t, tmpl)
			var names []string
			for _, o := range got {
				names = append(names, objName(o))
			}
			if len(got) == 0 || !reflect.DeepEqual(got, want) {
				t.Fatalf("helm install --dry-run=server printed %d objects %v, helm template renders %d: not the chart's", len(got), names, len(want))
			}
			for _, w := range tc.want {
				if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+w+" ") {
					t.Errorf("the release has no %s: %v", w, names)
				}
			}
			for _, o := range got {
				if str(o, "kind") == "ValidatingWebhookConfiguration" && str(o, "webhooks", 0, "clientConfig", "caBundle") != caBundle {
					t.Errorf("the webhook configuration does not carry the caBundle: %v", field(o, "webhooks", 0, "clientConfig"))
				}
			}
			t.Logf("helm install --dry-run=server (%s values): %d objects in %.1f s: %v", tc.name, len(got), time.Since(begin).Seconds(), names)

			// Every object admitted by the real apiserver (a dry run: nothing is stored).
			applied, err := c.kubectlIn(jsonList(t, got), "apply", "--server-side", "--dry-run=server", "--field-manager", "nri-accel-cluster-test", "-o", "name", "-f", "-")
			if err != nil {
				t.Fatalf("the apiserver refused the chart's objects: %v", err)
			}
			if n := len(strings.Fields(applied)); n != len(got) {
				t.Errorf("the apiserver admitted %d of %d objects: %s", n, len(got), applied)
			}
			if tc.name != "webhook" {
				return
			}
			// The control: the same objects with the match condition's CEL broken are refused.
			var broken []obj
			b, _ := json.Marshal(got)
			must(t, json.Unmarshal(b, &broken))
			for _, o := range broken {
				if str(o, "kind") == "ValidatingWebhookConfiguration" {
					mc := field(o, "webhooks", 0, "matchConditions", 0).(map[string]any)
					mc["expression"] = strings.Replace(mc["expression"].(string), "startsWith(", "startsWith((", 1)
				}
			}
			_, err = c.kubectlIn(jsonList(t, broken), "apply", "--server-side", "--dry-run=server", "--field-manager", "nri-accel-cluster-test", "-o", "name", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), "matchConditions") {
				t.Errorf("a webhook configuration with a broken matchConditions expression was not refused for it: %v", err)
			} else {
				t.Logf("control refused: %.300s", err)
			}
			// What helm's own dry run says of that broken chart (logged: it is helm's behaviour,
			// not the chart's): its checks do not compile CEL.
			broke := filepath.Join(t.TempDir(), "nri-accel")
			must(t, exec.Command("cp", "-r", chartDir(), broke).Run())
			wy := filepath.Join(broke, "templates", "webhook.yaml")
			b, err = os.ReadFile(wy)
			must(t, err)
			must(t, os.WriteFile(wy, []byte(strings.Replace(string(b), "startsWith(", "startsWith((", 1)), 0o644))
			_, err = c.helm(t, append([]string{"install", "--dry-run=server", "--namespace", ns, release, broke}, tc.args...)...)
			t.Logf("helm install --dry-run=server of the chart with the broken expression: error %v", err)
		})
	}
}

// hostWebhook is `nri-accel webhook` running on the machine as the chart's webhook service
// account (a Service's pods cannot be reached from the apiserver here), and the chart's
// ValidatingWebhookConfiguration still to be pointed at it.
type hostWebhook struct {
	proc     *proc
	url      string // https://127.0.0.1:<port>/validate
	caBundle string // the cluster CA the webhook's certificate is issued from, base64
	vwc      obj    // the chart's ValidatingWebhookConfiguration, as rendered
}

// startHostWebhook renders the chart with roles.webhook (and helmArgs), applies its webhook
// RBAC, and runs `nri-accel webhook` under name with config (a daemon config whose
// `  kubeconfig:` line is replaced by a token of the chart's webhook service account) and a
// certificate from the cluster's CA, until it serves.
func (c *Cluster) startHostWebhook(t *testing.T, name, config string, helmArgs ...string) hostWebhook {
	t.Helper()
	const release, ns = "nri-accel", "nri-accel"
	ca, err := os.ReadFile(c.pki.CA)
	must(t, err)
	h := hostWebhook{caBundle: base64.StdEncoding.EncodeToString(ca)}
	tmpl, err := c.helm(t, append([]string{"template", "--namespace", ns, release, chartDir(),
		"--set", "roles.webhook.enabled=true", "--set", "roles.webhook.caBundle=" + h.caBundle}, helmArgs...)...)
	must(t, err)
	var rbac []obj
	for _, o := range yamlObjects(t, tmpl) {
		switch objName(o) {
		case "ServiceAccount/nri-accel-webhook", "ClusterRole/nri-accel-webhook", "ClusterRoleBinding/nri-accel-webhook":
			rbac = append(rbac, o)
		case "ValidatingWebhookConfiguration/nri-accel":
			h.vwc = o
		}
	}
	if len(rbac) != 3 || h.vwc == nil {
		t.Fatalf("the chart rendered %d of the webhook's RBAC objects and webhook configuration %v", len(rbac), h.vwc != nil)
	}
	if out, err := c.kubectlIn(jsonList(t, rbac), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the chart's webhook RBAC: %v\n%s", err, out)
	}
	token := strings.TrimSpace(c.kubectl("create", "token", "nri-accel-webhook", "-n", ns, "--duration", "1h"))
	kubeconfig := c.pki.tokenKubeconfig(t, "nri-accel-webhook", c.Server, token)
	re := regexp.MustCompile(`(?m)^  kubeconfig: .*$`)
	if !re.MatchString(config) {
		t.Fatalf("no kubeconfig line in the config for %s:\n%s", name, config)
	}
	dir := filepath.Join(c.Dir, name)
	must(t, os.MkdirAll(filepath.Join(dir, "tls"), 0o755))
	whCfg := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(whCfg, []byte(re.ReplaceAllString(config, "  kubeconfig: "+kubeconfig)), 0o644))
	crt, key := c.pki.issue(t, name, "nri-accel-webhook", nil, "127.0.0.1")
	for from, to := range map[string]string{crt: "tls.crt", key: "tls.key"} {
		b, err := os.ReadFile(from)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, "tls", to), b, 0o600))
	}
	h.proc = startProc(t, "nri-accel-webhook", filepath.Join(c.Dir, "nri-accel-"+name+".log"), []string{"NRI_ACCEL_LOG=info"},
		accelBin(t), "--config", whCfg, "webhook", "--listen", "127.0.0.1:0", "--tls-dir", filepath.Join(dir, "tls"))
	served := regexp.MustCompile(`nri-accel webhook: serving (https://127\.0\.0\.1:\d+/validate)`)
	if !waitFor(30*time.Second, func() bool {
		b, _ := os.ReadFile(h.proc.Log)
		if m := served.FindSubmatch(b); m != nil {
			h.url = string(m[1])
		}
		return h.url != "" || !h.proc.Running()
	}) || h.url == "" {
		h.proc.Stop(5 * time.Second)
		t.Fatalf("nri-accel webhook is not serving:\n%s", tail(h.proc.Log, 30))
	}
	return h
}

// Scenario: the webhook against the real apiserver. `nri-accel webhook` runs on the host with a
// certificate made here and the chart's own service account and ClusterRole (a token of it
// lists the slices); the chart's ValidatingWebhookConfiguration (rules, matchConditions) is
// registered with clientConfig.url pointing at it. A pod asking more devices of pool whole than
// the node publishes is refused at create with the node's sentence; one that fits and one without
// annotations are admitted. With the webhook stopped: Ignore admits the bad pod, Fail refuses it
// with the apiserver's "failed calling webhook", and a pod without annotations is still admitted
// under Fail (the match condition keeps it from the webhook).
func scenarioWebhook(t *testing.T, c *Cluster) {
	const release = "nri-accel"
	// The node's config (its pools), reaching the apiserver as the webhook's service account.
	cfg, err := os.ReadFile(c.AccelCfg)
	must(t, err)
	h := c.startHostWebhook(t, "webhook", string(cfg))
	wh, url, caBundle, vwc := h.proc, h.url, h.caBundle, h.vwc
	t.Cleanup(func() { wh.Stop(5 * time.Second) })

	// The chart's webhook, pointed at the host's process.
	hook := field(vwc, "webhooks", 0).(map[string]any)
	hook["clientConfig"] = obj{"url": url, "caBundle": caBundle}
	setPolicy := func(p string) {
		hook["failurePolicy"] = p
		b, err := json.Marshal(vwc)
		must(t, err)
		if out, err := c.kubectlIn(string(b), "apply", "-f", "-"); err != nil {
			t.Fatalf("applying the webhook configuration (%s): %v\n%s", p, err, out)
		}
	}
	setPolicy("Ignore")
	defer c.kubectlErr("delete", "validatingwebhookconfiguration", release, "--ignore-not-found")

	const tooMany = "family=exclusive,count=2"
	create := func(name, ask string, dryRun bool) (string, error) {
		args := []string{"create", "-f", "-"}
		if dryRun {
			args = append(args, "--dry-run=server")
		}
		out, err := c.kubectlIn(webhookPodYAML(name, ask), args...)
		if err == nil && !dryRun {
			c.kubectlErr("delete", "pod", name, "-n", "default", "--wait=false")
		}
		return out, err
	}
	// The apiserver picks up a new configuration, and the webhook its first list of slices, a
	// moment later: wait until a dry-run create of the bad pod is refused.
	waitFor(60*time.Second, func() bool { _, err := create("ops-probe", tooMany, true); return err != nil })

	wantSentence := `admission webhook "pods.accel.nri.io" denied the request: container app of pod default/ops-too-many: ` +
		`claim ctr-<container id> refused: it asks 2 units of pool whole but the pool's devices have at most 1`
	var refusal string
	if _, err := create("ops-too-many", tooMany, false); err == nil {
		t.Errorf("a pod asking 2 devices of pool whole (the node publishes 1) was admitted\nwebhook:\n%s", tail(wh.Log, 20))
	} else if !strings.Contains(err.Error(), wantSentence) {
		t.Errorf("the pod asking too many was refused with\n  %v\nwant\n  %s", err, wantSentence)
	} else {
		refusal = wantSentence[strings.Index(wantSentence, "container app"):]
		t.Logf("refused: %s", err)
	}
	if _, err := create("ops-fits", "family=exclusive,count=1", false); err != nil {
		t.Errorf("a pod asking 1 device of pool whole was refused: %v", err)
	}
	if _, err := create("ops-plain", "", false); err != nil {
		t.Errorf("a pod without annotations was refused: %v", err)
	}
	// Each container fits alone, not both: the init container's device is held until the pod goes.
	// (family=exclusive: a bare count=1 may also take a share of shared0, which the node would grant.)
	one := "family=exclusive,count=1"
	both := strings.Replace(webhookPodYAML("ops-two", one), fmt.Sprintf("accel.nri.io/container.app: %q}", one),
		fmt.Sprintf("accel.nri.io/container.app: %q, accel.nri.io/container.prep: %q}", one, one), 1)
	both = strings.Replace(both, "  containers:\n", fmt.Sprintf("  initContainers:\n    - {name: prep, image: %s, command: [\"true\"]}\n  containers:\n", imageRef), 1)
	wantPod := `container app of pod default/ops-two: claim ctr-<container id> refused: ...; no node has enough for it beside the pod's containers before it (prep), ...`
	if _, err := c.kubectlIn(both, "create", "--dry-run=server", "-f", "-"); err == nil {
		t.Errorf("a pod whose init container and container each ask the node's one device was admitted\n%s", both)
	} else if !strings.Contains(err.Error(), "before it (prep)") {
		t.Errorf("the pod asking one device twice was refused with\n  %v\nwant a sentence naming prep, like\n  %s", err, wantPod)
	} else {
		t.Logf("refused: %s", err)
	}

	// Pods with DRA claims and KubeVirt VMs (issue 36), with the VMI rule the chart adds once
	// KubeVirt's CRD is served.
	webhookDRAandVMs(t, c, url, caBundle)
	// Back to the pods-only configuration for the failure policies below.
	setPolicy("Ignore")

	// The webhook down.
	wh.Stop(10 * time.Second)
	// Admitted, it reaches the node, whose NRI plugin refuses its container: with the sentence
	// the webhook gave, the container's id in place of <container id>.
	if _, err := c.kubectlIn(nodeAnnotationPodYAML("ops-ignored", tooMany), "create", "-f", "-"); err != nil {
		t.Errorf("failurePolicy Ignore, webhook down: the pod was refused: %v", err)
	} else if refusal != "" {
		node := regexp.MustCompile(strings.ReplaceAll(regexp.QuoteMeta(strings.Replace(refusal, "default/ops-too-many", "default/ops-ignored", 1)),
			regexp.QuoteMeta("<container id>"), "[0-9a-f]{64}"))
		var msg string
		waitFor(90*time.Second, func() bool {
			msg = str(c.pod("ops-ignored"), "status", "containerStatuses", 0, "state", "waiting", "message")
			return node.MatchString(msg)
		})
		if !node.MatchString(msg) {
			out, _ := c.kubectlErr("describe", "pod", "ops-ignored", "-n", "default")
			t.Errorf("the node did not refuse ops-ignored's container with the webhook's sentence %q; waiting message %q\n%s\nnri-accel:\n%s",
				node, msg, out, tail(c.Accel.Log, 20))
		} else {
			t.Logf("the node refused: %s", msg)
		}
		c.deletePod(t, "ops-ignored")
	}
	setPolicy("Fail")
	waitFor(60*time.Second, func() bool { _, err := create("ops-probe", tooMany, true); return err != nil })
	want := `failed calling webhook "pods.accel.nri.io"`
	if _, err := create("ops-failed", tooMany, false); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("failurePolicy Fail, webhook down: want %s, got %v", want, err)
	} else {
		t.Logf("refused: %s", err)
	}
	if _, err := create("ops-plain-fail", "", false); err != nil {
		t.Errorf("failurePolicy Fail, webhook down: a pod without annotations was refused: %v", err)
	}
}

// webhookPodYAML is a pod whose container app asks `ask` by annotation (none when empty). Its
// node selector matches no node: only its admission matters, it never runs.
func webhookPodYAML(name, ask string) string {
	ann := ""
	if ask != "" {
		ann = fmt.Sprintf("\n  annotations: {accel.nri.io/container.app: %q}", ask)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default%s
spec:
  automountServiceAccountToken: false
  nodeSelector: {nri-accel.test/never: "true"}
  containers:
    - name: app
      image: %s
      command: [sleep, "1"]
`, name, ann, imageRef)
}

// nodeAnnotationPodYAML is podYAML's pod (it runs on the node) asking `ask` by annotation for its
// container app.
func nodeAnnotationPodYAML(name, ask string) string {
	return strings.Replace(podYAML(name, ""), "namespace: default}",
		fmt.Sprintf("namespace: default, annotations: {accel.nri.io/container.app: %q}}", ask), 1)
}
