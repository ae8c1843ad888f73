package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The commands docs/kubernetes.md gives an operator, and the ones the suite ran: the page may
// only give commands the suite runs (issue 29 item 4). Every kubectl and helm call the suite
// makes through Cluster is recorded; the deploy scenario, which walks the page, compares.

var (
	ranMu sync.Mutex
	ran   [][]string
)

// recordRun notes one command the suite ran, program first.
func recordRun(argv ...string) {
	ranMu.Lock()
	defer ranMu.Unlock()
	ran = append(ran, append([]string(nil), argv...))
}

// ranSince answers the commands recorded after the first `from`.
func ranSince(from int) [][]string {
	ranMu.Lock()
	defer ranMu.Unlock()
	return append([][]string(nil), ran[from:]...)
}

// ranCount answers how many commands are recorded so far.
func ranCount() int {
	ranMu.Lock()
	defer ranMu.Unlock()
	return len(ran)
}

var inlineCommand = regexp.MustCompile("`((?:kubectl|helm) [^`]+)`")

// docCommands answers the kubectl and helm commands of a markdown page: every line of its fenced
// blocks (comments cut off), and every inline code span that starts with kubectl or helm.
func docCommands(page string) [][]string {
	var out [][]string
	add := func(line string) {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "kubectl" || f[0] == "helm") {
			out = append(out, f)
		}
	}
	fenced := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			add(line)
			continue
		}
		for _, m := range inlineCommand.FindAllStringSubmatch(line, -1) {
			add(m[1])
		}
	}
	return out
}

// flagAliases: the short flags the page uses and the long ones the suite may pass.
var flagAliases = map[string]string{"-n": "--namespace", "-o": "--output", "-f": "--filename"}

// splitCommand answers a command's positional words and its flags with their values (a flag
// followed by a word not starting with '-' takes it as its value; `-f` may repeat).
func splitCommand(argv []string) (words []string, flags [][2]string) {
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if !strings.HasPrefix(a, "-") {
			words = append(words, a)
			continue
		}
		name, value, hasValue := strings.Cut(a, "=")
		if long, ok := flagAliases[name]; ok {
			name = long
		}
		if !hasValue && i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "-") {
			value = argv[i+1]
			i++
		}
		flags = append(flags, [2]string{name, value})
	}
	return words, flags
}

var placeholder = regexp.MustCompile(`<[^>]+>(/?)`)

// sameWord: the page's word matches the suite's when equal, when the page's has placeholders
// (`<name>`, `nri-accel=<registry>/nri-accel:<version>`: each stands for any text, a
// `<registry>/` for none too), or when the page's is a repository path and the suite's names the
// same file by another root.
func sameWord(doc, got string) bool {
	if doc == got {
		return true
	}
	if strings.Contains(doc, "<") {
		parts := placeholder.Split(doc, -1)
		seps := placeholder.FindAllStringSubmatch(doc, -1)
		var re strings.Builder
		re.WriteString("^")
		for i, p := range parts {
			re.WriteString(regexp.QuoteMeta(p))
			if i < len(seps) {
				if seps[i][1] == "/" {
					re.WriteString("(.*/)?")
				} else {
					re.WriteString(".*")
				}
			}
		}
		re.WriteString("$")
		if regexp.MustCompile(re.String()).MatchString(got) {
			return true
		}
	}
	return strings.Contains(doc, "/") && strings.HasSuffix(filepath.Clean(got), "/"+filepath.Clean(doc))
}

// covers: the suite's command does what the page's says: the page's positional words begin the
// suite's, in order (prose names a command by its first words, "`helm upgrade`"), and every flag
// of the page is there with a matching value (the suite may add flags of its own, such as --wait
// or its values file; the page's comments invite the operator's own too).
func covers(doc, got []string) bool {
	dw, df := splitCommand(doc)
	gw, gf := splitCommand(got)
	if len(dw) > len(gw) {
		return false
	}
	for i := range dw {
		if !sameWord(dw[i], gw[i]) {
			return false
		}
	}
	for _, want := range df {
		found := false
		for _, have := range gf {
			if have[0] == want[0] && sameWord(want[1], have[1]) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// uncovered answers the page's commands no recorded command covers.
func uncovered(page string, runs [][]string) []string {
	var missing []string
	for _, doc := range docCommands(page) {
		found := false
		for _, r := range runs {
			if covers(doc, r) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, strings.Join(doc, " "))
		}
	}
	return missing
}

// kubernetesPage answers docs/kubernetes.md.
func kubernetesPage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testsDir(), "..", "docs", "kubernetes.md"))
	must(t, err)
	return string(b)
}

// TestClusterDocMatcher checks the matcher itself (no cluster, no root).
func TestClusterDocMatcher(t *testing.T) {
	page := "Run `kubectl get pods -n x` then:\n\n```\nhelm install r packaging/helm/c -n ns --create-namespace   # --set for more\n# a comment\nkubectl delete -f packaging/a.yaml -f packaging/b.yaml\n```\n"
	cmds := docCommands(page)
	if len(cmds) != 3 {
		t.Fatalf("commands %q, want 3", cmds)
	}
	runs := [][]string{
		{"kubectl", "get", "pods", "--namespace", "x"},
		{"helm", "install", "r", "/src/packaging/helm/c", "--create-namespace", "--set", "image.tag=1", "--wait", "--namespace", "ns"},
	}
	if got := uncovered(page, runs); len(got) != 1 || !strings.HasPrefix(got[0], "kubectl delete") {
		t.Errorf("uncovered %q, want the delete alone", got)
	}
	runs = append(runs, []string{"kubectl", "delete", "-f", "/src/packaging/a.yaml"})
	if got := uncovered(page, runs); len(got) != 1 {
		t.Errorf("a run deleting one of the two files covers the page's: %q", got)
	}
	runs = append(runs, []string{"kubectl", "delete", "-f", "/src/packaging/b.yaml", "-f", "/src/packaging/a.yaml", "--wait=true"})
	if got := uncovered(page, runs); len(got) != 0 {
		t.Errorf("uncovered %q, want none", got)
	}
	if covers([]string{"kubectl", "get", "pods", "-n", "x"}, []string{"kubectl", "get", "pods", "-n", "y"}) {
		t.Errorf("another namespace covers the page's")
	}
	if !covers([]string{"helm", "upgrade"}, []string{"helm", "upgrade", "r", "/src/c", "--reuse-values"}) || covers([]string{"helm", "upgrade"}, runs[1]) {
		t.Errorf("prose's `helm upgrade` is covered by a helm upgrade alone")
	}
	set := []string{"kubectl", "set", "image", "ds/a", "a=<registry>/a:<version>"}
	for got, want := range map[string]bool{"a=a:1": true, "a=reg.io/a:1": true, "a=b:1": false} {
		if covers(set, []string{"kubectl", "set", "image", "ds/a", got}) != want {
			t.Errorf("%s for %s: want %v", got, set[4], want)
		}
	}
}

// walkVerify runs what docs/kubernetes.md's "Verify" gives an operator against the daemon in the
// DaemonSet's pod, examples.yaml included: the slices, one slice as YAML, `nri-accel status` in
// the pod, its log, and the examples' pods with their claims. The examples name ubuntu:24.04 and
// there is no registry: the suite's busybox image is tagged so (the pods only sleep). train and
// infer run, infer with the env of its claim's opaque configuration; notebook asks a 1g.10gb
// partition, a profile the suite's sliced pool does not define, and stays Pending.
func (d *deployment) walkVerify(t *testing.T) {
	c := d.c
	pkg := filepath.Join(testsDir(), "..", "packaging", "kubernetes")
	slices := strings.Fields(c.kubectl("get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io", "-o", "name"))
	c.kubectl("get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io")
	if len(slices) == 0 {
		t.Fatalf("no ResourceSlice of accel.nri.io")
	}
	if y := c.kubectl("get", "resourceslice", strings.TrimPrefix(slices[0], "resourceslice.resource.k8s.io/"), "-o", "yaml"); !strings.Contains(y, "driver: accel.nri.io") {
		t.Errorf("kubectl get resourceslice <name> -o yaml:\n%s", y)
	}
	if st := c.kubectl("exec", "-n", "nri-accel", "ds/nri-accel", "--", "nri-accel", "status"); !strings.Contains(st, "registered") {
		t.Errorf("nri-accel status in the DaemonSet's pod does not say the kubelet registered it:\n%s", st)
	}
	if l := c.kubectl("logs", "-n", "nri-accel", "ds/nri-accel"); !strings.Contains(l, "accel") {
		t.Errorf("kubectl logs -n nri-accel ds/nri-accel printed nothing of nri-accel's:\n%s", l)
	}

	ctr := filepath.Join(buildPeer(t, containerdPeer), "ctr")
	if out, err := exec.Command(ctr, "--address", c.CRISocket, "-n", "k8s.io", "images", "tag", "--force", imageRef, "docker.io/library/ubuntu:24.04").CombinedOutput(); err != nil {
		t.Fatalf("ctr images tag: %v\n%s", err, out)
	}
	// examples.yaml has a template of the suite's name (one-gpu); templates are immutable.
	c.kubectl("delete", "resourceclaimtemplate", "one-gpu", "-n", "default", "--ignore-not-found")
	examples := filepath.Join(pkg, "examples.yaml")
	c.kubectl("apply", "-f", examples)
	for _, p := range []string{"train", "infer"} {
		c.waitRunning(t, p, 120*time.Second)
	}
	env, err := c.ExecIn("default", "infer", "server", "env")
	must(t, err)
	if !strings.Contains(env, "INFERENCE_MODE=batch\n") {
		t.Errorf("infer lacks its claim's configured INFERENCE_MODE=batch:\n%s", env)
	}
	if p := c.pod("notebook"); str(p, "spec", "nodeName") != "" {
		t.Errorf("notebook was bound, but no pool defines the 1g.10gb profile it asks")
	}
	claims := c.kubectl("get", "resourceclaims")
	if n := strings.Count(claims, "allocated,reserved"); n != 2 {
		t.Errorf("kubectl get resourceclaims shows %d claims allocated,reserved, want train's and infer's:\n%s", n, claims)
	}
	c.kubectl("delete", "-f", examples, "--wait=true", "--timeout=120s")
	c.applyTemplate(t, "one-gpu", "accel-gpu")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Errorf("after the examples went, nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}
