package fleet

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Request is what one VM asks of a host.
type Request struct {
	VM           string
	CPUs         int
	Memory       int64 // bytes
	Labels       map[string]string
	AntiAffinity string
	// Images are the digests of the stored images its disks stand on
	// (VMRecord.Images): a host whose store holds them starts it without
	// a pull, and takes a moving VM's overlay by its top layer alone.
	Images []string
}

// RequestOf is the VM's request, from its spec.
func RequestOf(vm *spec.VM) Request {
	return Request{VM: vm.Name, CPUs: vm.CPUs, Memory: int64(vm.Memory),
		Labels: vm.Placement.Labels, AntiAffinity: vm.Placement.AntiAffinity}
}

// RequestOfRecord is RequestOf with the images rec records.
func RequestOfRecord(rec VMRecord, vm *spec.VM) Request {
	r := RequestOf(vm)
	for _, im := range rec.Images {
		if !slices.Contains(r.Images, im.Digest) {
			r.Images = append(r.Images, im.Digest)
		}
	}
	return r
}

// Load is a VM already placed on (or moving to) a host: what it takes there.
type Load struct {
	Request
	Host string
}

// Unschedulable says why no host can take a VM; its text is the status
// `fleet ls` shows.
type Unschedulable struct {
	VM     string
	Reason string
}

func (u *Unschedulable) Error() string { return u.VM + ": unschedulable: " + u.Reason }

// Choose picks the host for r among hosts (alive, taking VMs), given the
// loads already placed, excluding the hosts in skip (a VM's own host when
// it moves away). The pick: the host whose store holds the most of the
// VM's images (no pull, or a top-layer copy for a move), then it spreads
// VMs: the most free memory after the VM, then the most free vCPUs, then
// the name (a stable order). It is pure: the caller commits the choice
// with a compare-and-swap.
func Choose(r Request, hosts []Host, loads []Load, skip ...string) (string, error) {
	type free struct {
		cpus int
		mem  int64
	}
	left := map[string]free{}
	groups := map[string]bool{} // hosts running a VM of r's anti-affinity group
	for _, h := range hosts {
		left[h.Name] = free{h.CPUs, h.Memory}
	}
	for _, l := range loads {
		if l.VM == r.VM {
			continue // its own load moves with it
		}
		f := left[l.Host]
		left[l.Host] = free{f.cpus - l.CPUs, f.mem - l.Memory}
		if r.AntiAffinity != "" && l.AntiAffinity == r.AntiAffinity {
			groups[l.Host] = true
		}
	}
	var fits []string
	why := map[string][]string{} // reason -> hosts
	for _, h := range hosts {
		f := left[h.Name]
		switch {
		case slices.Contains(skip, h.Name):
			continue
		case h.Draining:
			why["draining"] = append(why["draining"], h.Name)
		case !hasLabels(h.Labels, r.Labels):
			why["no label "+missingLabels(h.Labels, r.Labels)] = append(why["no label "+missingLabels(h.Labels, r.Labels)], h.Name)
		case groups[h.Name]:
			why["runs a VM of anti-affinity group "+r.AntiAffinity] = append(why["runs a VM of anti-affinity group "+r.AntiAffinity], h.Name)
		case f.mem < r.Memory || f.cpus < r.CPUs:
			k := fmt.Sprintf("%d vCPUs and %s free", max(f.cpus, 0), spec.Size(max(f.mem, 0)))
			why[k] = append(why[k], h.Name)
		default:
			fits = append(fits, h.Name)
		}
	}
	if len(fits) == 0 {
		return "", &Unschedulable{VM: r.VM, Reason: unschedulableReason(r, len(hosts)-len(skip), why)}
	}
	held := map[string]int{}
	for _, h := range hosts {
		held[h.Name] = holds(h, r.Images)
	}
	sort.Slice(fits, func(i, j int) bool {
		a, b := left[fits[i]], left[fits[j]]
		if held[fits[i]] != held[fits[j]] {
			return held[fits[i]] > held[fits[j]]
		}
		if a.mem != b.mem {
			return a.mem > b.mem
		}
		if a.cpus != b.cpus {
			return a.cpus > b.cpus
		}
		return fits[i] < fits[j]
	})
	return fits[0], nil
}

// holds is how many of images (digests) h's store holds.
func holds(h Host, images []string) int {
	n := 0
	for _, d := range images {
		if slices.Contains(h.Images, d) {
			n++
		}
	}
	return n
}

func hasLabels(have, want map[string]string) bool { return missingLabels(have, want) == "" }

// missingLabels is the first wanted label (in key order) the host lacks, as
// "key=value".
func missingLabels(have, want map[string]string) string {
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := have[k]; !ok || v != want[k] {
			return k + "=" + want[k]
		}
	}
	return ""
}

// unschedulableReason is one line: what the VM needs and, per reason, the
// hosts it rules out.
func unschedulableReason(r Request, hosts int, why map[string][]string) string {
	if hosts <= 0 {
		return "no host is registered and alive"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(why)) {
		parts = append(parts, strings.Join(why[k], ",")+": "+k)
	}
	return fmt.Sprintf("needs %d vCPUs and %s; no host fits (%s)", r.CPUs, spec.Size(r.Memory), strings.Join(parts, "; "))
}
