package spec

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/internal/host/userfile"
)

// Profiles: a VM file may start with include = ["base.toml", "web.toml"]
// (paths relative to the file; a profile may include others). The files
// are merged in order, the VM file last, each over what came before:
//
//   - tables ([boot], [limits], ...) are merged key by key, deeply;
//   - [[disk]] and [[nic]] are merged by name: an entry of a later file
//     with the name of an earlier one is merged into it key by key, one
//     with a new name is added after them;
//   - any other value, arrays included, is replaced whole;
//   - relative paths in a profile are taken against the profile's
//     directory.
//
// The result is the VM (File.Raw holds it, without include, so that what
// vmsup records stands alone); File.Origins says which file and line gave
// each value, and errors name them.

// maxIncludeDepth bounds profiles including profiles.
const maxIncludeDepth = 8

// byName are the arrays of tables merged by their entries' names.
var byName = []string{"disk", "nic"}

// Origin is where a value of a merged file was written.
type Origin struct {
	File string
	Pos  Position
}

func (o Origin) String() string { return fmt.Sprintf("%s:%d:%d", o.File, o.Pos.Line, o.Pos.Col) }

// layer is one file of a merge: its tree and where its keys are.
type layer struct {
	path string
	tree map[string]any
	pos  map[string]keyPos
}

// hasInclude reports whether data has a top-level include key (cheaply:
// most files have none).
func hasInclude(data []byte) bool {
	if !bytes.Contains(data, []byte("include")) {
		return false
	}
	_, ok := positions(data)["include"]
	return ok
}

// mergeIncludes merges the files path includes with it: the merged TOML
// and each key's origin.
func mergeIncludes(path string, data []byte) ([]byte, map[string]Origin, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	layers, err := loadLayers(abs, path, data, nil)
	if err != nil {
		return nil, nil, err
	}
	merged := map[string]any{}
	origins := map[string]Origin{}
	for _, l := range layers {
		mergeTable(merged, l.tree, "", "", l, origins)
	}
	out, err := toml.Marshal(tablesOut(merged))
	if err != nil {
		return nil, nil, &Error{File: path, Msg: fmt.Sprintf("merging its includes: %v", err), Err: err}
	}
	return out, origins, nil
}

// loadLayers reads the file at abs (named as shown in errors) and what it
// includes, in merge order; chain is the includes leading to it.
func loadLayers(abs, shown string, data []byte, chain []string) ([]layer, error) {
	if slices.Contains(chain, abs) {
		return nil, &Error{File: shown, Field: "include", Msg: fmt.Sprintf("includes itself (through %s)", strings.Join(chain, " -> "))}
	}
	if len(chain) > maxIncludeDepth {
		return nil, &Error{File: shown, Field: "include", Msg: fmt.Sprintf("includes nest deeper than %d files", maxIncludeDepth)}
	}
	tree := map[string]any{}
	if err := toml.Unmarshal(data, &tree); err != nil {
		return nil, &Error{File: shown, Msg: err.Error(), Err: err}
	}
	pos := positions(data)
	incs, err := includes(shown, tree["include"], pos)
	if err != nil {
		return nil, err
	}
	delete(tree, "include")
	chain = append(chain, abs)
	var out []layer
	for _, inc := range incs {
		p := inc
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(abs), p)
		}
		b, err := userfile.Read(p, userfile.MaxSpec)
		if err != nil {
			return nil, &Error{File: shown, Pos: pos["include"].Position, Field: "include", Msg: err.Error(), Err: err}
		}
		sub, err := loadLayers(p, p, b, chain)
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	if len(chain) > 1 {
		absPaths(reflect.TypeFor[VM](), tree, filepath.Dir(abs)) // its host path keys, as tagged
	}
	return append(out, layer{path: shown, tree: tree, pos: pos}), nil
}

func includes(shown string, v any, pos map[string]keyPos) ([]string, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	var out []string
	for _, x := range list {
		s, isStr := x.(string)
		if !isStr || s == "" {
			ok = false
			break
		}
		out = append(out, s)
	}
	if !ok {
		return nil, &Error{File: shown, Pos: pos["include"].Position, Field: "include", Msg: "want a list of file names: include = [\"base.toml\"]"}
	}
	return out, nil
}

// tables are the tables of an array of tables (nil for another value).
func tables(v any) []map[string]any {
	var out []map[string]any
	switch a := v.(type) {
	case []any:
		for _, x := range a {
			m, ok := x.(map[string]any)
			if !ok {
				return nil
			}
			out = append(out, m)
		}
	case []map[string]any:
		out = a
	}
	return out
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// mergeTable merges src (of layer l, at key path spath there) into dst
// (at dpath in the result), noting each value's origin.
func mergeTable(dst, src map[string]any, dpath, spath string, l layer, origins map[string]Origin) {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		dk, sk := join(dpath, k), join(spath, k)
		from := Origin{File: l.path, Pos: l.pos[sk].Position}
		if m, ok := src[k].(map[string]any); ok {
			dm, ok := dst[k].(map[string]any)
			if !ok {
				dropOrigins(origins, dk)
				dm = map[string]any{}
				dst[k] = dm
			}
			origins[dk] = from
			mergeTable(dm, m, dk, sk, l, origins)
			continue
		}
		if ts := tables(src[k]); ts != nil && slices.Contains(byName, k) && dpath == "" {
			dst[k] = mergeNamed(tables(dst[k]), ts, dk, sk, l, origins)
			continue
		}
		dropOrigins(origins, dk)
		dst[k] = src[k]
		origins[dk] = from
		for i := range tables(src[k]) { // an array of tables replaced whole
			origins[fmt.Sprintf("%s[%d]", dk, i)] = Origin{File: l.path, Pos: l.pos[fmt.Sprintf("%s[%d]", sk, i)].Position}
		}
	}
}

// mergeNamed merges the entries of src into dst by their names.
func mergeNamed(dst, src []map[string]any, dpath, spath string, l layer, origins map[string]Origin) []map[string]any {
	for j, e := range src {
		idx := -1
		if name, ok := e["name"].(string); ok && name != "" {
			idx = slices.IndexFunc(dst, func(d map[string]any) bool { return d["name"] == name })
		}
		if idx < 0 {
			dst = append(dst, map[string]any{})
			idx = len(dst) - 1
		}
		dk, sk := fmt.Sprintf("%s[%d]", dpath, idx), fmt.Sprintf("%s[%d]", spath, j)
		origins[dk] = Origin{File: l.path, Pos: l.pos[sk].Position}
		mergeTable(dst[idx], e, dk, sk, l, origins)
	}
	return dst
}

// dropOrigins forgets the origins of key and the keys inside it.
func dropOrigins(origins map[string]Origin, key string) {
	for k := range origins {
		if k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[") {
			delete(origins, k)
		}
	}
}

// tablesOut makes arrays of tables []map[string]any, which go-toml writes
// as [[key]] tables (what positions indexes).
func tablesOut(m map[string]any) map[string]any {
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			tablesOut(x)
		case []any, []map[string]any:
			if ts := tables(x); len(ts) > 0 {
				for _, t := range ts {
					tablesOut(t)
				}
				m[k] = ts
			}
		}
	}
	return m
}

// Origins are where each value of f was written, by key ("memory",
// "disk[1].file"), for a file with includes; nil for one without.
func (f *File) Origins() map[string]Origin { return f.origins }

// originOf is the origin of field or of the nearest table holding it.
func (f *File) originOf(field string) (Origin, bool) {
	for field != "" {
		if o, ok := f.origins[field]; ok {
			return o, true
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return Origin{}, false
}

// placeAt names the file and line a merged file's value came from in e.
func (f *File) placeAt(e *Error) {
	if f.origins == nil || e.Field == "" || e.File != f.Path {
		return
	}
	if o, ok := f.originOf(e.Field); ok {
		e.File, e.Pos = o.File, o.Pos
	}
}

// OriginLines lists every value of f with where it came from, one line
// each in key order: `memory = "1G"  # base.toml:3:1`.
func (f *File) OriginLines() []string {
	var keys []string
	for k, p := range f.pos {
		if p.value != "" || p.kind != 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keyLess(keys[i], keys[j]) })
	var out []string
	for _, k := range keys {
		where := Origin{File: f.Path, Pos: f.pos[k].Position}
		if o, ok := f.originOf(k); ok {
			where = o
		}
		out = append(out, fmt.Sprintf("%s = %s  # %s", k, f.rawValue(k), where))
	}
	return out
}

// rawValue is the value of key as written in f.Raw.
func (f *File) rawValue(key string) string {
	p := f.pos[key]
	if p.end > p.start && p.end <= len(f.Raw) {
		kv := string(f.Raw[p.start:p.end])
		if _, v, ok := strings.Cut(kv, "="); ok {
			return strings.TrimSpace(v)
		}
	}
	return p.value
}

// keyLess orders keys with their array indexes as numbers.
func keyLess(a, b string) bool {
	pa, pb := strings.FieldsFunc(a, isSep), strings.FieldsFunc(b, isSep)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			return na < nb
		}
		return pa[i] < pb[i]
	}
	return len(pa) < len(pb)
}

func isSep(r rune) bool { return r == '.' || r == '[' || r == ']' }
