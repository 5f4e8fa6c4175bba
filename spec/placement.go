package spec

import (
	"fmt"
	"regexp"
	"sort"
)

// Placement is where a fleet may run the VM (vmsup fleet; a single host
// ignores it): only on hosts that carry every label, and never on a host
// that already runs a VM of the same anti-affinity group.
type Placement struct {
	Labels       map[string]string `toml:"labels"`        // e.g. {zone = "a", disk = "ssd"}
	AntiAffinity string            `toml:"anti_affinity"` // a group name: its VMs go to different hosts
}

// labelRE is what a label key, a label value and a group name may be: short,
// printable, and free of the "=" and "," that the agent's --labels flag uses.
var labelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$`)

// ValidLabel reports whether s may be a label key, a label value or an
// anti-affinity group.
func ValidLabel(s string) error {
	if !labelRE.MatchString(s) {
		return fmt.Errorf("%q: want 1-63 of [A-Za-z0-9_./-], starting with a letter or digit", s)
	}
	return nil
}

func (f *File) validatePlacement() error {
	p := f.VM.Placement
	keys := make([]string, 0, len(p.Labels))
	for k := range p.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ValidLabel(k); err != nil {
			return f.Errorf("placement.labels", "key %v", err)
		}
		if err := ValidLabel(p.Labels[k]); err != nil {
			return f.Errorf("placement.labels."+k, "%v", err)
		}
	}
	if p.AntiAffinity != "" {
		if err := ValidLabel(p.AntiAffinity); err != nil {
			return f.Errorf("placement.anti_affinity", "%v", err)
		}
	}
	return nil
}
