package spec

import (
	"errors"
	"strings"
	"testing"
)

// One run names every problem of a file: values of the wrong type (each
// left out, the rest decoded again), unknown keys, bad values; a key with
// a type error does not also show up as missing.
func TestParseReportsTypeAndValueErrors(t *testing.T) {
	data := "name = \"r\"\n" +
		"memory = true\n" + // 2: type error; not also "memory: missing"
		"cpus = \"two\"\n" + // 3: type error
		"machine = \"q99\"\n" + // 4: bad value
		"stop_timeout = 30\n" + // 5: bare duration
		"colour = \"blue\"\n" + // 6: unknown key
		"[boot]\nkernel = \"/k\"\n" +
		"[[disk]]\nname = \"a\"\nfile = \"/a.qcow2\"\nsize = 5.5\nformat = \"zip\"\n" + // 12: type error, 13: bad value
		"[[nic]]\nname = \"n\"\ntype = [\n  \"bridge\",\n]\n" // 15: a multi-line value of the wrong type
	want := []string{
		`r.toml:2:1: memory: invalid size "true"`,
		`r.toml:3:8: cpus: want a whole number, not a TOML string`,
		`r.toml:4:1: machine: unknown machine "q99" (want "q35", "pc", or a versioned pc-q35-X.Y or pc-i440fx-X.Y)`,
		`r.toml:5:1: stop_timeout: a bare number has no unit: write "30s" for seconds`,
		`r.toml:6:1: colour: unknown key`,
		`r.toml:12:1: disk[0].size: invalid size "5.5"`,
		`r.toml:13:1: disk[0].format: unknown format "zip" (want "qcow2" or "raw")`,
		`r.toml:16:8: nic[0].type: want a string in quotes, not a TOML array`,
	}
	_, err := Parse("r.toml", []byte(data))
	var list *Errors
	if !errors.As(err, &list) {
		t.Fatalf("err = %v, want *Errors", err)
	}
	t.Logf("%v", err)
	var got []string
	for _, e := range list.List {
		got = append(got, e.Error())
	}
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("error %d:\n got %s\nwant %s...", i, got[i], want[i])
		}
	}
	for _, g := range got {
		if strings.Contains(g, "missing") {
			t.Errorf("a key with a type error is also reported missing: %s", g)
		}
	}
}

// ParsePartial gives the file as far as it could be read, with its errors
// and the fields they concern, so the host checks can run on the rest.
func TestParsePartial(t *testing.T) {
	data := "name = \"p\"\nmemory = \"256M\"\ncpus = \"two\"\n[boot]\nkernel = \"/k\"\n" +
		"[[disk]]\nname = \"a\"\nfile = \"/a.qcow2\"\nformat = \"zip\"\n[[disk]]\nname = \"b\"\nfile = \"/b.qcow2\"\n"
	f, err := ParsePartial("p.toml", []byte(data))
	if f == nil || err == nil || f.Err() == nil || err.Error() != f.Err().Error() {
		t.Fatalf("ParsePartial = %v, %v", f, err)
	}
	if f.VM.Memory != 256*MiB || f.VM.CPUs != 1 || len(f.VM.Disks) != 2 {
		t.Errorf("partial VM: %+v", f.VM)
	}
	for field, want := range map[string]bool{"cpus": true, "disk[0]": true, "disk[0].file": false, "disk[1]": false, "memory": false, "disk": true} {
		if got := f.Broken(field); got != want {
			t.Errorf("Broken(%q) = %v, want %v", field, got, want)
		}
	}
	if g, err := Parse("p.toml", []byte(data)); g != nil || err == nil {
		t.Errorf("Parse of a broken file = %v, %v", g, err)
	}
	if f, err := ParsePartial("s.toml", []byte("name = \"s\n")); f != nil || err == nil {
		t.Errorf("ParsePartial of a syntax error = %v, %v", f, err)
	}
}

// Join puts the host's errors with the file's own: in file order, one
// line each, without those about a field the file has wrong already, said
// once.
func TestJoin(t *testing.T) {
	data := "name = \"j\"\nmemory = \"256M\"\ncpus = \"two\"\n[boot]\nkernel = \"/k\"\n"
	f, _ := ParsePartial("j.toml", []byte(data))
	if f == nil {
		t.Fatal("ParsePartial: nil")
	}
	kernel := f.Errorf("boot.kernel", "/k: no such file")
	err := f.Join(f.Err(), kernel, f.Errorf("cpus", "4 is more than this host has"), nil,
		errors.New("j.toml: QEMU binary \"q\" not found\nsecond line"), errors.New("j.toml: QEMU binary \"q\" not found"))
	want := "j.toml:3:8: cpus: want a whole number, not a TOML string\n" +
		"j.toml:5:1: boot.kernel: /k: no such file\n" +
		"j.toml: QEMU binary \"q\" not found\n" +
		"j.toml: second line"
	if err == nil || err.Error() != want {
		t.Fatalf("Join:\n%v\nwant\n%s", err, want)
	}
	if got := f.Join(nil, kernel); got != kernel {
		t.Errorf("one error: %v, want it as it was", got)
	}
	if f.Join() != nil || f.Join(nil) != nil {
		t.Error("no errors: not nil")
	}
}
