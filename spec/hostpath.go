package spec

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
)

// A key of a VM file that names a file or directory on the host is tagged
// `vmsup:"hostpath"`, or `vmsup:"hostpath,PLACE"` where its place is not
// the image places (PlaceDisk, PlaceFirmware, PlaceConfig); a string key
// whose name or comment says path but that is not one is tagged
// `vmsup:"notpath"`. This is the one list: Load makes these paths
// absolute, internal/host/places checks them against the host's places, and
// TestHostPathTags fails on a path-like key tagged neither way.

// Places a host path's key may name beyond the image places
// (internal/host/places decides what each allows).
const (
	PlaceImage    = ""         // image places (the default)
	PlaceDisk     = "disk"     // image places, or a block device in a block directory
	PlaceFirmware = "firmware" // image places, or the distribution's firmware
	PlaceConfig   = "config"   // configuration places (host secrets, Ceph, CNI)
)

// HostPath is one key of a VM file that names a host path.
type HostPath struct {
	Key   string  // as errors name it: "boot.kernel", "disk[0].file"
	Place string  // PlaceImage, PlaceDisk, PlaceFirmware or PlaceConfig
	Ptr   *string // the value (empty when the key is unset)
}

// HostPaths lists the host path keys of vm, set or not, in file order.
func (vm *VM) HostPaths() []HostPath { return hostPaths(reflect.ValueOf(vm).Elem(), "") }

// HostPaths lists the host path keys of disk d; prefix is its key
// ("disk[0]", or "" for a disk given alone: "file", "backing").
func (d *Disk) HostPaths(prefix string) []HostPath {
	return hostPaths(reflect.ValueOf(d).Elem(), prefix)
}

// PathPlace is the place of a host path key by its last part ("file",
// "disk[0].file", "boot.vars_template"); ok is false for a key that names
// no host path.
func PathPlace(key string) (place string, ok bool) {
	last, _, _ := strings.Cut(key[strings.LastIndexByte(key, '.')+1:], "[") // "files[1]": "files"
	place, ok = pathPlaces[last]
	return place, ok
}

// pathPlaces maps each host path key's last part to its place.
var pathPlaces = func() map[string]string {
	m := map[string]string{}
	eachField(reflect.TypeFor[VM](), func(_ reflect.Type, f reflect.StructField) {
		if place, ok := hostPathTag(f); ok {
			m[tomlKey(f)] = place
		}
	}, map[reflect.Type]bool{})
	return m
}()

// eachField calls fn with every field of t and of every table type
// reachable from it (tables, optional ones, arrays of them, embedded
// structs), each type once.
func eachField(t reflect.Type, fn func(owner reflect.Type, f reflect.StructField), seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		fn(t, f)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() {
			eachField(ft, fn, seen)
		}
	}
}

// hostPathTag parses a field's vmsup tag: whether it names a host path,
// and its place.
func hostPathTag(f reflect.StructField) (place string, ok bool) {
	tag := f.Tag.Get("vmsup")
	if tag != "hostpath" && !strings.HasPrefix(tag, "hostpath,") {
		return "", false
	}
	return strings.TrimPrefix(strings.TrimPrefix(tag, "hostpath"), ","), true
}

// tomlKey is a field's TOML key ("" for an embedded struct, whose keys
// are its parent's).
func tomlKey(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if f.Anonymous && name == "" {
		return ""
	}
	return name
}

// keyUnder is key under prefix ("disk[0]" and "file": "disk[0].file").
func keyUnder(prefix, key string) string {
	if prefix == "" || key == "" {
		return prefix + key
	}
	return prefix + "." + key
}

func hostPaths(v reflect.Value, prefix string) []HostPath {
	var out []HostPath
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		key := tomlKey(f)
		if !f.IsExported() || key == "-" {
			continue
		}
		place, ok := hostPathTag(f)
		switch {
		case ok && fv.Kind() == reflect.String:
			out = append(out, HostPath{keyUnder(prefix, key), place, fv.Addr().Interface().(*string)})
		case ok && fv.Kind() == reflect.Slice:
			for j := range fv.Len() {
				out = append(out, HostPath{fmt.Sprintf("%s[%d]", keyUnder(prefix, key), j), place, fv.Index(j).Addr().Interface().(*string)})
			}
		case !ok:
			out = append(out, nestedHostPaths(fv, keyUnder(prefix, key))...)
		}
	}
	return out
}

// nestedHostPaths are the host paths of a field that holds tables: a
// table (or an embedded struct, whose keys are its parent's), an optional
// one or an array of them.
func nestedHostPaths(fv reflect.Value, key string) []HostPath {
	switch {
	case fv.Kind() == reflect.Struct:
		return hostPaths(fv, key)
	case fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct && !fv.IsNil():
		return hostPaths(fv.Elem(), key)
	case fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct:
		var out []HostPath
		for j := range fv.Len() {
			out = append(out, hostPaths(fv.Index(j), fmt.Sprintf("%s[%d]", key, j))...)
		}
		return out
	}
	return nil
}

// absPaths makes the relative host paths of m, a profile's decoded table
// of type t, absolute against dir (the profile's directory).
func absPaths(t reflect.Type, m map[string]any, dir string) {
	abs := func(v any) any {
		if s, ok := v.(string); ok && s != "" && !filepath.IsAbs(s) {
			return filepath.Join(dir, s)
		}
		return v
	}
	for i := range t.NumField() {
		f := t.Field(i)
		key := tomlKey(f)
		if _, ok := hostPathTag(f); ok {
			if list, ok := m[key].([]any); ok {
				for j := range list {
					list[j] = abs(list[j])
				}
			} else if v, ok := m[key]; ok {
				m[key] = abs(v)
			}
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if !f.IsExported() || ft.Kind() != reflect.Struct || ft.PkgPath() != t.PkgPath() {
			continue
		}
		if key == "" {
			absPaths(ft, m, dir)
			continue
		}
		if sub, ok := m[key].(map[string]any); ok {
			absPaths(ft, sub, dir)
		}
		for _, sub := range tables(m[key]) {
			absPaths(ft, sub, dir)
		}
	}
}
