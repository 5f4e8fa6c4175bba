package fleet

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

const gib = int64(1) << 30

func TestChooseSpreads(t *testing.T) {
	hosts := []Host{{Name: "a", CPUs: 4, Memory: 4 * gib}, {Name: "b", CPUs: 4, Memory: 4 * gib}, {Name: "c", CPUs: 4, Memory: 2 * gib}}
	var loads []Load
	var got []string
	for _, vm := range []string{"v1", "v2", "v3", "v4", "v5", "v6"} {
		r := Request{VM: vm, CPUs: 1, Memory: gib}
		h, err := Choose(r, hosts, loads)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h)
		loads = append(loads, Load{Request: r, Host: h})
	}
	// Most free memory first, names breaking ties: a, b, a, b, then c and
	// a/b all have 2 GiB free... the order is stable.
	if want := "a b a b c a"; strings.Join(got, " ") != want {
		t.Fatalf("placements %v, want %s", got, want)
	}
}

func TestChooseRefusals(t *testing.T) {
	hosts := []Host{{Name: "a", CPUs: 2, Memory: 2 * gib, Labels: map[string]string{"zone": "x"}}, {Name: "b", CPUs: 2, Memory: 2 * gib, Draining: true}}
	loads := []Load{{Request: Request{VM: "w1", CPUs: 1, Memory: gib, AntiAffinity: "web"}, Host: "a"}}
	for _, c := range []struct {
		r    Request
		want string
	}{
		{Request{VM: "big", CPUs: 1, Memory: 64 * gib}, "needs 1 vCPUs and 64G; no host fits (a: 1 vCPUs and 1G free; b: draining)"},
		{Request{VM: "mars", CPUs: 1, Memory: gib, Labels: map[string]string{"zone": "mars"}}, "a: no label zone=mars"},
		{Request{VM: "w2", CPUs: 1, Memory: gib, AntiAffinity: "web"}, "a: runs a VM of anti-affinity group web"},
		{Request{VM: "cpu", CPUs: 2, Memory: gib}, "a: 1 vCPUs and 1G free"},
	} {
		_, err := Choose(c.r, hosts, loads)
		var u *Unschedulable
		if !errors.As(err, &u) || !strings.Contains(u.Reason, c.want) {
			t.Errorf("%s: got %v, want a reason with %q", c.r.VM, err, c.want)
		}
	}
	if _, err := Choose(Request{VM: "x", CPUs: 1}, nil, nil); err == nil || !strings.Contains(err.Error(), "no host is registered") {
		t.Errorf("no hosts: %v", err)
	}
	// A VM's own load does not count against it (a drain re-places it).
	if h, err := Choose(Request{VM: "w1", CPUs: 1, Memory: gib, AntiAffinity: "web"}, hosts[:1], loads); err != nil || h != "a" {
		t.Errorf("own load: %q %v", h, err)
	}
}

// TestChooseImages: a host whose store holds more of the VM's images comes
// first (no pull; a move copies the top layer only), then free memory; a
// host that does not fit, or drains, is never picked for its images.
func TestChooseImages(t *testing.T) {
	const img1, img2, img3 = "sha256:01", "sha256:02", "sha256:03"
	hosts := []Host{
		{Name: "a", CPUs: 4, Memory: 4 * gib},
		{Name: "b", CPUs: 4, Memory: 2 * gib, Images: []string{img1}},
		{Name: "c", CPUs: 4, Memory: 2 * gib, Images: []string{img1, img2}},
		{Name: "d", CPUs: 4, Memory: 8 * gib, Images: []string{img1, img2, img3}, Draining: true},
	}
	for _, c := range []struct {
		what   string
		images []string
		memory int64
		want   string
	}{
		{"no images: the most free memory", nil, gib, "a"},
		{"an image no host holds: the most free memory", []string{"sha256:ff"}, gib, "a"},
		{"one image: its holders first, then memory and name", []string{img1}, gib, "b"},
		{"two images: the host holding both", []string{img1, img2}, gib, "c"},
		{"the order of the images does not matter", []string{img2, img1}, gib, "c"},
		{"the holders do not fit: the host that does", []string{img1, img2}, 3 * gib, "a"},
		{"a draining holder is never picked", []string{img3}, gib, "a"},
	} {
		got, err := Choose(Request{VM: "v", CPUs: 1, Memory: c.memory, Images: c.images}, hosts, nil)
		if err != nil || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.what, got, err, c.want)
		}
	}
	// Loads count as before: c full, b holds img1 and fits.
	loads := []Load{{Request: Request{VM: "w", CPUs: 1, Memory: 2 * gib}, Host: "c"}}
	if got, err := Choose(Request{VM: "v", CPUs: 1, Memory: gib, Images: []string{img1, img2}}, hosts, loads); err != nil || got != "b" {
		t.Errorf("c full: %q %v, want b (holds one of the two)", got, err)
	}
	rec := VMRecord{Images: []ImageRef{{Disk: "root", Digest: img1}, {Disk: "data", Digest: img1}, {Disk: "x", Digest: img2}}}
	if r := RequestOfRecord(rec, &spec.VM{Name: "v"}); strings.Join(r.Images, " ") != img1+" "+img2 {
		t.Errorf("RequestOfRecord: images %v, want each digest once", r.Images)
	}
}
