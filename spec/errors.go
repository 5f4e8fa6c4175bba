package spec

import (
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// Errors is every problem found in one file, in file order. errors.As finds
// its first *Error, so callers that want one error still get one.
type Errors struct {
	List []*Error
}

// Error is one line per problem.
func (e *Errors) Error() string {
	lines := make([]string, len(e.List))
	for i, x := range e.List {
		lines[i] = x.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap gives the problems to errors.Is and errors.As.
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, x := range e.List {
		out[i] = x
	}
	return out
}

// joinErrors returns nil, the one *Error, or an *Errors sorted by position
// (errors without one last, in the order found).
func (f *File) joinErrors(errs []*Error) error {
	for _, e := range errs {
		f.placeAt(e)
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i].Pos, errs[j].Pos
		if (a.Line == 0) != (b.Line == 0) {
			return b.Line == 0
		}
		return before(a, b)
	})
	return &Errors{List: errs}
}

// bytesHint explains a size written without a unit (5 or "5"): it is bytes.
func (f *File) bytesHint(field string) string {
	if p, ok := f.pos[field]; ok && p.value != "" && strings.Trim(p.value, "0123456789") == "" {
		return " (a bare number is bytes: write e.g. \"512M\")"
	}
	return ""
}

var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

// bareDurations refuses durations written as TOML numbers: go-toml stores a
// number in a Duration (an int64) as nanoseconds, so "stop_timeout = 30" was
// 30 ns and down skipped the graceful shutdown.
func (f *File) bareDurations() []*Error {
	keys := map[string]bool{}
	typedKeys(reflect.TypeOf(VM{}), "", keys, durationType)
	var errs []*Error
	for k, p := range f.pos {
		if !keys[indexRE.ReplaceAllString(k, "[]")] {
			continue
		}
		if p.kind == unstable.Integer || p.kind == unstable.Float {
			errs = append(errs, &Error{File: f.Path, Pos: p.Position, Field: k,
				Msg: "a bare number has no unit: write \"" + p.value + "s\" for seconds"})
		}
	}
	return errs
}

var durationType = reflect.TypeOf(Duration(0))

var goTypeRE = regexp.MustCompile(`^cannot decode TOML (\w+) into struct field \S+ of type (\S+)$`)

// plainDecodeMsg words go-toml's type mismatch without Go type names.
func plainDecodeMsg(msg string) string {
	m := goTypeRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	var want string
	switch t := m[2]; {
	case t == "spec.Size":
		want = "a size such as \"512M\""
	case t == "spec.Duration":
		want = "a duration such as \"30s\""
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		want = "a whole number"
	case strings.HasPrefix(t, "float"):
		want = "a number"
	case t == "bool" || t == "*bool":
		want = "true or false"
	case t == "string":
		want = "a string in quotes"
	case strings.HasPrefix(t, "[]spec."):
		want = "a [[table]] list"
	case strings.HasPrefix(t, "[]"):
		want = "a list [...]"
	case strings.HasPrefix(t, "spec.") || strings.HasPrefix(t, "map["):
		want = "a [table]"
	default:
		want = "another kind of value"
	}
	return "want " + want + ", not a TOML " + m[1]
}

// knownKeys lists the key paths of t ("memory", "boot.kernel", "disk[].file").
func knownKeys(t reflect.Type, prefix string, out map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		fl := t.Field(i)
		name, _, _ := strings.Cut(fl.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[prefix+name] = true
		ft := fl.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != durationType:
			knownKeys(ft, prefix+name+".", out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			knownKeys(ft.Elem(), prefix+name+"[].", out)
		}
	}
}

// unknownKeyMsg explains an unknown key: a near spelling in the same table,
// the table where that key belongs, or the keys the table has. meant are
// the known keys it names ("memory", "boot.kernel", "disk[].file").
func unknownKeyMsg(key string, known map[string]bool) (msg string, meant []string) {
	table, leaf := cutLast(key)
	var here, elsewhere, there []string
	for k := range known {
		kt, kl := cutLast(k)
		switch {
		case kt == table && editDistance(kl, leaf) <= 2:
			here = append(here, kl)
		case kt != table && kl == leaf:
			elsewhere = append(elsewhere, tableName(kt))
			there = append(there, k)
		}
	}
	sort.Strings(here)
	sort.Strings(elsewhere)
	sort.Strings(there)
	switch {
	case len(here) > 0:
		for _, h := range here {
			meant = append(meant, table+h)
		}
		return "unknown key; did you mean \"" + strings.Join(here, "\" or \"") + "\"?", meant
	case len(elsewhere) > 0:
		return "unknown key here; \"" + leaf + "\" belongs in " + strings.Join(elsewhere, " or "), there
	}
	var keys []string
	for k := range known {
		if kt, kl := cutLast(k); kt == table {
			keys = append(keys, kl)
		}
	}
	sort.Strings(keys)
	where := "at the top level"
	if table != "" {
		where = "in " + tableName(table)
	}
	return "unknown key; the keys " + where + " are: " + strings.Join(keys, ", "), nil
}

// cutLast splits "boot.kernel" into "boot." and "kernel".
func cutLast(k string) (table, leaf string) {
	i := strings.LastIndexByte(k, '.')
	return k[:i+1], k[i+1:]
}

// tableName renders a key prefix as a user writes the table: "[boot]", "[[disk]]".
func tableName(prefix string) string {
	p := strings.TrimSuffix(prefix, ".")
	if p == "" {
		return "the top level"
	}
	if strings.HasSuffix(p, "[]") {
		return "[[" + strings.TrimSuffix(p, "[]") + "]]"
	}
	return "[" + p + "]"
}

// editDistance is the Levenshtein distance of two short keys.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// keyAt names the key go-toml reports (without list indices) as the file
// writes it, "disk[1].file", using the positions of the keys on its line.
func (f *File) keyAt(key []string, row, col int) (string, Position) {
	want := strings.Join(key, ".")
	for k, p := range f.pos {
		if p.Line == row && indexRE.ReplaceAllString(k, "") == want {
			return k, p.Position
		}
	}
	return want, Position{row, col}
}
