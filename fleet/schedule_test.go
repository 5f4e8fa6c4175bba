package fleet

import (
	"errors"
	"strings"
	"testing"
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
