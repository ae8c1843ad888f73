package cluster

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
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

// sameWord: the page's word matches the suite's when equal, when the page's is a placeholder
// (`<name>`), or when the page's is a repository path and the suite's names the same file by
// another root.
func sameWord(doc, got string) bool {
	if doc == got || (strings.HasPrefix(doc, "<") && strings.HasSuffix(doc, ">")) {
		return true
	}
	return strings.Contains(doc, "/") && strings.HasSuffix(filepath.Clean(got), "/"+filepath.Clean(doc))
}

// covers: the suite's command does what the page's says: the same positional words in order,
// and every flag of the page with a matching value (the suite may add flags of its own, such as
// --wait or its values file; the page's comments invite the operator's own too).
func covers(doc, got []string) bool {
	dw, df := splitCommand(doc)
	gw, gf := splitCommand(got)
	if len(dw) != len(gw) {
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
}
