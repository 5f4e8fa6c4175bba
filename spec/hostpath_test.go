package spec

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pathWords are what a key's name says when it may name a host file.
var pathWords = regexp.MustCompile(`(?i)path|file|image|kernel|initrd|firmware|socket|dir(s|ectory)?($|_)|conf|template|cert|rom|bios|vars|mount|device`)

// pathDoc is what a key's comment says when it may name a host file.
var pathDoc = regexp.MustCompile(`(?i)\b(path|directory|file name|host file)\b`)

// TestHostPathTags: every string key of a VM file (every table reachable
// from VM) whose name or comment suggests a host path is tagged either
// vmsup:"hostpath" (Load makes it absolute, internal/host/places checks it)
// or vmsup:"notpath"; the tags are well-formed; a key means the same place
// wherever it appears. So a new key naming a file cannot go unchecked.
func TestHostPathTags(t *testing.T) {
	docs := fieldDocs(t)
	places := map[string]string{}
	n := 0
	eachField(reflect.TypeFor[VM](), func(owner reflect.Type, f reflect.StructField) {
		where := owner.Name() + "." + f.Name
		tag := f.Tag.Get("vmsup")
		key := tomlKey(f)
		isText := f.Type.Kind() == reflect.String || f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.String
		switch {
		case tag != "" && !slices.Contains([]string{"notpath", "hostpath", "hostpath," + PlaceDisk, "hostpath," + PlaceFirmware, "hostpath," + PlaceConfig}, tag):
			t.Errorf("%s: unknown tag vmsup:%q", where, tag)
		case tag != "" && !isText:
			t.Errorf("%s: vmsup:%q on a %s: only a string (or a list of them) names a host path", where, tag, f.Type)
		case tag == "" && isText && (pathWords.MatchString(f.Name) || pathWords.MatchString(key) || pathDoc.MatchString(docs[where])):
			t.Errorf("%s (key %q) may name a host path: tag it vmsup:\"hostpath\" (checked against the host's places) "+
				"or vmsup:\"notpath\"", where, key)
		}
		if place, ok := hostPathTag(f); ok {
			n++
			if p, seen := places[key]; seen && p != place {
				t.Errorf("%s: key %q is place %q here and %q elsewhere (internal/host/places decides by the key)", where, key, place, p)
			}
			places[key] = place
		}
	}, map[reflect.Type]bool{})
	if n < 10 {
		t.Errorf("found %d host path keys, want the 10 of today at least (the walk is broken)", n)
	}
}

// fieldDocs maps "Type.Field" to the comments of every struct field of
// the package's source.
func fieldDocs(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				for _, fl := range st.Fields.List {
					for _, id := range fl.Names {
						out[ts.Name.Name+"."+id.Name] = fl.Doc.Text() + " " + fl.Comment.Text()
					}
				}
			}
			return false
		})
	}
	return out
}

// TestHostPaths: the keys in file order, a disk alone, and a profile's
// relative paths made absolute against its own directory.
func TestHostPaths(t *testing.T) {
	vm := VM{Boot: Boot{Kernel: "k"}, Disks: []Disk{{File: "f", Image: "alias"}}, Shares: []Share{{Path: "s"}}}
	var keys []string
	for _, p := range vm.HostPaths() {
		keys = append(keys, p.Key+"="+*p.Ptr)
	}
	want := "boot.kernel=k boot.initrd= boot.vars_template= disk[0].file=f disk[0].backing= disk[0].ceph_conf= " +
		"disk[0].secret_file= disk[0].user_data_file= disk[0].meta_data_file= disk[0].network_config_file= share[0].path=s"
	if got := strings.Join(keys, " "); got != want {
		t.Errorf("HostPaths:\n got %s\nwant %s", got, want)
	}
	if p := vm.Disks[0].HostPaths(""); p[0].Key != "file" || p[0].Place != PlaceDisk || *p[0].Ptr != "f" {
		t.Errorf("a disk's: %+v", p[0])
	}
	for key, want := range map[string]string{"disk[1].file": PlaceDisk, "secret_file": PlaceConfig, "boot.vars_template": PlaceFirmware, "share[0].path": PlaceImage} {
		if got, ok := PathPlace(key); !ok || got != want {
			t.Errorf("PathPlace(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
	if _, ok := PathPlace("disk[0].image"); ok {
		t.Error("disk.image (not a path) has a place")
	}
	tree := map[string]any{"boot": map[string]any{"kernel": "k", "cmdline": "c"},
		"disk": []any{map[string]any{"file": "f", "image": "alias"}}, "nic": []any{map[string]any{"cni_config": "/abs.conf"}}}
	absPaths(reflect.TypeFor[VM](), tree, "/p")
	boot, disk, nic := tree["boot"].(map[string]any), tree["disk"].([]any)[0].(map[string]any), tree["nic"].([]any)[0].(map[string]any)
	if boot["kernel"] != "/p/k" || boot["cmdline"] != "c" || disk["file"] != "/p/f" || disk["image"] != "alias" || nic["cni_config"] != "/abs.conf" {
		t.Errorf("a profile's paths: %v %v %v", boot, disk, nic)
	}
}
