package spec

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A relative file path ("vmsup up rel.toml") resolves relative paths inside
// it against the file's absolute directory, as "$PWD/rel.toml" does.
func TestRelativeFilePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	data := []byte("name = \"rel\"\nmemory = \"64M\"\n[boot]\nkernel = \"vmlinux\"\n[[disk]]\nname = \"d\"\nfile = \"d.qcow2\"\n")
	for _, path := range []string{"rel.toml", "./rel.toml", filepath.Join(dir, "rel.toml")} {
		f, err := Parse(path, data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if got := f.VM.Boot.Kernel; got != filepath.Join(dir, "vmlinux") {
			t.Errorf("%s: kernel = %q, want %q", path, got, filepath.Join(dir, "vmlinux"))
		}
		if got := f.VM.Disks[0].File; got != filepath.Join(dir, "d.qcow2") {
			t.Errorf("%s: disk file = %q", path, got)
		}
	}
	if err := os.WriteFile("rel.toml", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := Load("rel.toml"); err != nil || f.VM.Boot.Kernel != filepath.Join(dir, "vmlinux") {
		t.Errorf("Load(rel.toml) = %+v, %v", f, err)
	}
}

// A bare integer for a duration was taken as nanoseconds.
func TestBareDuration(t *testing.T) {
	for _, v := range []string{"30", "1.5"} {
		_, err := Parse("d.toml", []byte("name = \"d\"\nmemory = \"64M\"\nstop_timeout = "+v+"\n[boot]\nkernel = \"/k\"\n"))
		want := `d.toml:3:1: stop_timeout: a bare number has no unit: write "` + v + `s" for seconds`
		if err == nil || err.Error() != want {
			t.Errorf("stop_timeout = %s: %v, want %s", v, err, want)
		}
	}
	_, err := Parse("d.toml", []byte("name = \"d\"\nmemory = 5\n[boot]\nkernel = \"/k\"\n"))
	if err == nil || !strings.Contains(err.Error(), "a bare number is bytes") {
		t.Errorf("memory = 5: %v, want the bytes hint", err)
	}
}

// Every error of a file, in file order; errors.As still finds the first.
func TestAllErrorsInFileOrder(t *testing.T) {
	data := "name = \"x\"\nmemory = \"8M\"\nmachine = \"pcx\"\n[boot]\nkernel = \"/k\"\nfirmware = \"nope\"\n" +
		"[[disk]]\nname = \"a\"\nfile = \"/a\"\nformat = \"zip\"\n[[nic]]\ntype = \"warp\"\n"
	_, err := Parse("m.toml", []byte(data))
	var list *Errors
	if !errors.As(err, &list) {
		t.Fatalf("err = %v, want *Errors", err)
	}
	var lines []int
	for _, e := range list.List {
		lines = append(lines, e.Pos.Line)
	}
	t.Logf("%v", err)
	if len(list.List) != 5 {
		t.Fatalf("%d errors (lines %v), want 5:\n%v", len(list.List), lines, err)
	}
	for i := 1; i < len(lines); i++ {
		if lines[i] < lines[i-1] {
			t.Errorf("not in file order: lines %v", lines)
		}
	}
	var first *Error
	if !errors.As(err, &first) || first.Field != "memory" {
		t.Errorf("errors.As first = %+v", first)
	}
	// Unknown keys: all of them at once.
	_, err = Parse("u.toml", []byte("name = \"u\"\nmemry = \"1G\"\nkernel = \"/k\"\n[boot]\nkernal = \"/k\"\n"))
	if !errors.As(err, &list) || len(list.List) != 3 {
		t.Fatalf("unknown keys: %v", err)
	}
}

func TestErrorsTeach(t *testing.T) {
	for _, c := range []struct{ toml, want string }{
		{"memry = \"1G\"", `t.toml:3:1: memry: unknown key; did you mean "memory"?`},
		{"kernel = \"/k\"", `t.toml:3:1: kernel: unknown key here; "kernel" belongs in [boot]`},
		{"[boot]\nkernal = \"/k\"", `t.toml:4:1: boot.kernal: unknown key; did you mean "kernel"?`},
		{"[[disk]]\nname = \"a\"\nfile = \"/a\"\n[[disk]]\nname = \"b\"\nfiel = \"/b\"", `t.toml:8:1: disk[1].fiel: unknown key; did you mean "file"?`},
		{"[[disk]]\nname = \"a\"\nfile = \"/a\"\n[[disk]]\nname = \"b\"\nfile = 5", `t.toml:8:8: disk[1].file: want a string in quotes, not a TOML integer`},
		{"cpus = \"2\"", `t.toml:3:8: cpus: want a whole number, not a TOML string`},
		{"autostart = \"yes\"", `t.toml:3:13: autostart: want true or false, not a TOML string`},
	} {
		boot := "[boot]\nkernel = \"/k\"\n" // the rest of the file is sound: c.want is its one error
		if strings.Contains(c.toml, "[boot]") {
			boot = ""
		}
		_, err := Parse("t.toml", []byte("name = \"t\"\nmemory = \"64M\"\n"+c.toml+"\n"+boot))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.toml, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), "spec.") || strings.Contains(err.Error(), "testdata/")) {
			t.Errorf("%q: Go type or repository path in %v", c.toml, err)
		}
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load("/nonexistent/x.toml")
	if err == nil || err.Error() != "/nonexistent/x.toml: no such file or directory" {
		t.Errorf("Load = %v", err)
	}
}
