package spec

import (
	"fmt"
	"strings"
)

// reserved are the names vmsup's own units take after "vmsup-": a VM of
// one of these names would have the unit name of (or share a prefix's
// namespace with) something vmsup runs that is not a VM, and `down NAME`
// would stop that instead. Instance units ("vmsup-log@web:1.service") do
// not clash by themselves (no VM unit has an "@"), but their template names
// are kept too, so that a unit's name alone never leaves a doubt.
var reserved = map[string]string{
	"api":             "vmsup-api.service, the remote API server",
	"agent":           "vmsup-agent.service, the fleet agent",
	"metrics":         "vmsup-metrics.socket, the Prometheus endpoint",
	"metrics-collect": "vmsup-metrics-collect.socket, the metrics collector",
	"log":             "vmsup-log@.service, a VM's console logger",
	"tpm":             "vmsup-tpm@.service, a VM's TPM",
	"dnsmasq":         "vmsup-dnsmasq@.service, a network's DHCP and DNS",
	"fleet-guard":     "vmsup-fleet-guard-*.service, the fleet's fencing guardians",
	"fs":              "vmsup-fs-*@.service, a VM's virtiofs daemons",
}

// Reserved says why name may not be a VM's (nil when it may): it is one of
// vmsup's own units' names (case-insensitively: a file system that folds
// case folds the state directories too), or begins as a family of them
// does ("fleet-guard-"; "vmsup-" itself would read as "vmsup-vmsup-...").
func Reserved(name string) error {
	lower := strings.ToLower(name)
	if what, ok := reserved[lower]; ok {
		return fmt.Errorf("name %q is reserved: it is the name of vmsup's own unit %s, not of a VM", name, what)
	}
	if strings.HasPrefix(lower, "fleet-guard-") {
		return fmt.Errorf("name %q is reserved: vmsup-fleet-guard-*.service are the fleet's fencing guardians, not VMs", name)
	}
	return nil
}

// ReservedNames lists the reserved names, for documentation and tests.
func ReservedNames() []string {
	out := make([]string, 0, len(reserved))
	for n := range reserved {
		out = append(out, n)
	}
	return out
}
