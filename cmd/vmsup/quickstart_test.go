package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// defaultRoot is vmsup's state root when --root and VMSUP_ROOT are unset:
// the quickstart names a path under it, the test its own root.
const defaultRoot = "/var/lib/vmsup"

// quickstart returns the command lines of README's "Quickstart" (its
// indented block), comments cut.
func quickstart(t *testing.T, repo string) [][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Quickstart\n")
	if !ok {
		t.Fatal(`README.md has no "## Quickstart" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var lines [][]string
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "    ") {
			continue
		}
		var words []string
		for _, w := range strings.Fields(l) {
			if strings.HasPrefix(w, "#") {
				break
			}
			words = append(words, w)
		}
		lines = append(lines, words)
	}
	if len(lines) == 0 {
		t.Fatal("README's quickstart has no command lines")
	}
	return lines
}

// TestReadmeQuickstart runs README's quickstart line by line as written:
// its vmsup commands with this test's vmsup, state root and systemd, from
// the repository's top (examples/demo.toml as it is); its set-up lines are
// checked to name what the suite itself ran (the scripts, the package the
// test binary is built from). Each vmsup command must succeed and do what
// its comment says; the console is given a line to echo.
func TestReadmeQuickstart(t *testing.T) {
	repo, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	demo, err := os.ReadFile(filepath.Join(repo, "examples", "demo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(demo), "kernel = \""+env.Guest.Kernel+"\"") {
		t.Skipf("examples/demo.toml names the guest in /var/cache/vmsup/guest; this run's guest is %s (VMSUP_GUEST_DIR)", env.Guest.Kernel)
	}
	root := t.TempDir()
	seen := map[string]bool{}
	defer vmsup(t, root, "", "down", "--force", "demo")
	for _, words := range quickstart(t, repo) {
		line := strings.Join(words, " ")
		switch {
		case words[0] == "bash":
			for i := 0; i+1 < len(words); i += 3 { // bash SCRIPT [&& bash SCRIPT]...
				if words[i] != "bash" || (i+2 < len(words) && words[i+2] != "&&") {
					t.Fatalf("quickstart line %q: not bash SCRIPT [&& bash SCRIPT]", line)
				}
				if _, err := os.Stat(filepath.Join(repo, words[i+1])); err != nil {
					t.Fatalf("quickstart line %q: %v", line, err)
				}
			}
		case len(words) == 5 && words[0] == "go" && words[1] == "build" && words[2] == "-o" && filepath.Base(words[3]) == "vmsup":
			if words[4] != "./cmd/vmsup" {
				t.Fatalf("quickstart line %q: builds %s, not ./cmd/vmsup", line, words[4])
			}
		case words[0] == "vmsup":
			verb := quickstartRun(t, root, repo, words[1:])
			seen[verb] = true
		default:
			t.Fatalf("quickstart line %q: this test does not know how to run it", line)
		}
	}
	for _, verb := range []string{"up", "ls", "console", "snapshot create", "down"} {
		if !seen[verb] {
			t.Errorf("the quickstart no longer shows vmsup %s", verb)
		}
	}
}

// quickstartRun runs one vmsup command of the quickstart in repo with root
// standing for the default state root, checks it did what the quickstart
// says, and returns its verb.
func quickstartRun(t *testing.T, root, repo string, args []string) string {
	t.Helper()
	for i, a := range args {
		if a == defaultRoot || strings.HasPrefix(a, defaultRoot+"/") {
			args[i] = root + strings.TrimPrefix(a, defaultRoot)
		}
	}
	verb := args[0]
	if len(args) > 1 && (verb == "snapshot" || verb == "disk") {
		verb += " " + args[1]
	}
	stdin, want := "", ""
	switch verb {
	case "up":
		want = "demo: started"
	case "ls":
		want = "running"
	case "console":
		testenv.WaitLog(t, filepath.Join(root, "vms", "demo", "console.log"), "VMSUP-SHELL-READY", time.Minute)
		stdin, want = "echo VMSUP-QUICKSTART-$((6*7))\n", "VMSUP-QUICKSTART-42"
	case "disk attach":
		want = "attached"
	case "snapshot ls":
		want = "first"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := vmsupCmd(ctx, root, args...)
	cmd.Dir = repo
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	t.Logf("vmsup %s (%.1fs):\n%s%s", strings.Join(args, " "), time.Since(start).Seconds(), o.String(), e.String())
	if err != nil {
		t.Fatalf("vmsup %s: %v", strings.Join(args, " "), err)
	}
	if !strings.Contains(o.String(), want) {
		t.Fatalf("vmsup %s: no %q in its output", strings.Join(args, " "), want)
	}
	return verb
}
