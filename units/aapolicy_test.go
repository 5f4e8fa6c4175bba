package units_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// aaPolicy is the file rules of an AppArmor profile with everything it
// includes, for asking whether the profile lets a process open a path.
// This kernel has no AppArmor to ask (the notes' apparmor.md); the
// matching follows apparmor.d(5): "*" does not cross "/", "**" does, and
// either right after a "/" matches at least one character (so "/d/**" is
// not "/d/"); variables come from the tunables; "//" is "/".
type aaPolicy struct {
	allow, deny []aaRule
}

type aaRule struct {
	re    *regexp.Regexp
	perms string
	src   string // the rule as written, for messages
}

// loadAAPolicy reads profile text, resolving its includes under incDir.
func loadAAPolicy(t *testing.T, text, incDir string) *aaPolicy {
	t.Helper()
	var lines []string
	if err := aaFlatten(text, incDir, &lines, 0); err != nil {
		t.Fatal(err)
	}
	vars := map[string][]string{}
	varDef := regexp.MustCompile(`^@\{(\w+)\}\s*(\+?=)\s*(.*)$`)
	for _, l := range lines {
		if m := varDef.FindStringSubmatch(l); m != nil {
			if m[2] == "=" {
				vars[m[1]] = nil
			}
			vars[m[1]] = append(vars[m[1]], strings.Fields(m[3])...)
		}
	}
	p := &aaPolicy{}
	rule := regexp.MustCompile(`^((?:(?:audit|deny|owner|allow|file)\s+)*)("(?:[^"\\]|\\.)*"|[/@]\S*)\s+([rwakmlixuUpPcC]+)\s*(?:->.*)?,$`)
	for _, l := range lines {
		m := rule.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		path := m[2]
		if strings.HasPrefix(path, `"`) {
			path = path[1 : len(path)-1]
		}
		for _, x := range aaExpand(path, vars, 0) {
			r := aaRule{re: regexp.MustCompile("^" + aaGlob(x) + "$"), perms: m[3], src: l}
			if strings.Contains(m[1], "deny") {
				p.deny = append(p.deny, r)
			} else {
				p.allow = append(p.allow, r)
			}
		}
	}
	return p
}

// aaFlatten appends the lines of text to out, with each include replaced
// by the lines of what it names (a directory: each file in it).
func aaFlatten(text, incDir string, out *[]string, depth int) error {
	if depth > 16 {
		return fmt.Errorf("apparmor includes nest too deep")
	}
	inc := regexp.MustCompile(`^#?include\s+(if\s+exists\s+)?[<"]([^>"]+)[>"]`)
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if m := inc.FindStringSubmatch(l); m != nil {
			name := m[2]
			if !filepath.IsAbs(name) {
				name = filepath.Join(incDir, name)
			}
			files := []string{name}
			if st, err := os.Stat(name); err == nil && st.IsDir() {
				files, _ = filepath.Glob(filepath.Join(name, "*"))
			} else if err != nil {
				if m[1] != "" {
					continue
				}
				return err
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				if err := aaFlatten(string(b), incDir, out, depth+1); err != nil {
					return err
				}
			}
			continue
		}
		if i := strings.IndexByte(l, '#'); i >= 0 && !strings.Contains(l[:i], `"`) {
			l = strings.TrimSpace(l[:i])
		}
		if l != "" {
			*out = append(*out, l)
		}
	}
	return nil
}

// aaExpand replaces the variables of a path pattern by each of their
// values.
func aaExpand(s string, vars map[string][]string, depth int) []string {
	i := strings.Index(s, "@{")
	if i < 0 || depth > 16 {
		return []string{s}
	}
	j := strings.IndexByte(s[i:], '}')
	if j < 0 {
		return []string{s}
	}
	var out []string
	for _, v := range vars[s[i+2:i+j]] {
		out = append(out, aaExpand(s[:i]+v+s[i+j+1:], vars, depth+1)...)
	}
	return out
}

// aaGlob is an AppArmor path glob as a Go regular expression.
func aaGlob(g string) string {
	g = regexp.MustCompile(`/+`).ReplaceAllString(g, "/")
	var b strings.Builder
	braces := 0
	for i := 0; i < len(g); i++ {
		c := g[i]
		afterSlash := i > 0 && g[i-1] == '/'
		switch {
		case c == '\\' && i+1 < len(g):
			i++
			b.WriteString(regexp.QuoteMeta(string(g[i])))
		case c == '*' && i+1 < len(g) && g[i+1] == '*':
			i++
			if afterSlash {
				b.WriteString(`[^/].*`)
			} else {
				b.WriteString(`.*`)
			}
		case c == '*':
			if afterSlash {
				b.WriteString(`[^/][^/]*`)
			} else {
				b.WriteString(`[^/]*`)
			}
		case c == '?':
			b.WriteString(`[^/]`)
		case c == '[':
			j := strings.IndexByte(g[i:], ']')
			if j < 0 {
				b.WriteString(`\[`)
				continue
			}
			cls := g[i+1 : i+j]
			if strings.HasPrefix(cls, "^") {
				cls = "^/" + cls[1:]
			}
			b.WriteString("[" + cls + "]")
			i += j
		case c == '{':
			braces++
			b.WriteString(`(?:`)
		case c == '}' && braces > 0:
			braces--
			b.WriteString(`)`)
		case c == ',' && braces > 0:
			b.WriteString(`|`)
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// allows reports whether the policy lets the process open path with each
// of perms ("r", "w"), and names the rule that denies it or "no rule".
func (p *aaPolicy) allows(path, perms string) (bool, string) {
	for _, want := range perms {
		for _, r := range p.deny {
			if strings.ContainsRune(r.perms, want) && r.re.MatchString(path) {
				return false, "denied by " + r.src
			}
		}
		ok := false
		for _, r := range p.allow {
			if (strings.ContainsRune(r.perms, want) || want == 'w' && strings.ContainsRune(r.perms, 'a')) && r.re.MatchString(path) {
				ok = true
				break
			}
		}
		if !ok {
			return false, fmt.Sprintf("no rule allows %c", want)
		}
	}
	return true, ""
}

// TestAAPolicyMatching: the matcher agrees with apparmor.d(5) on the cases
// the profile coverage test relies on.
func TestAAPolicyMatching(t *testing.T) {
	vars := map[string][]string{"PROC": {"/proc/"}, "pid": {"{[1-9],[1-9][0-9]}"}}
	for _, c := range []struct {
		glob, path string
		want       bool
	}{
		{"/sys/devices/system/node/**", "/sys/devices/system/node/node0/meminfo", true},
		{"/sys/devices/system/node/**", "/sys/devices/system/node/", false},
		{"/sys/devices/system/node/", "/sys/devices/system/node/", true},
		{"/usr/lib/x86_64-linux-gnu/qemu/*", "/usr/lib/x86_64-linux-gnu/qemu/", false},
		{"/usr/lib/x86_64-linux-gnu/qemu/*", "/usr/lib/x86_64-linux-gnu/qemu/a/b", false},
		{"@{PROC}/@{pid}/{status,maps}", "/proc/42/maps", true},
		{"@{PROC}/@{pid}/{status,maps}", "/proc/420/maps", false},
		{"/{usr/,}lib{,32,64}/**.so*", "/usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{`/a/glob\*.raw`, "/a/glob*.raw", true},
		{`/a/glob\*.raw`, "/a/globx.raw", false},
	} {
		var got bool
		for _, x := range aaExpand(c.glob, vars, 0) {
			got = got || regexp.MustCompile("^"+aaGlob(x)+"$").MatchString(c.path)
		}
		if got != c.want {
			t.Errorf("%s matches %s: %v, want %v (regexp %s)", c.glob, c.path, got, c.want, aaGlob(c.glob))
		}
	}
}
