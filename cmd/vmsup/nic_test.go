package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestNICAttachFlags: every field of [[nic]] is a flag of nic attach, as
// README promises (a NIC on a managed network could not be hot-plugged:
// --network was unknown).
func TestNICAttachFlags(t *testing.T) {
	flags := nicAttachCmd(&globals{}).Flags()
	// The name is the second argument; the lists are repeatable flags
	// named in the singular.
	named := map[string]string{"name": "", "forwards": "forward", "security_groups": "security-group"}
	typ := reflect.TypeFor[spec.NIC]()
	for i := range typ.NumField() {
		key, _, _ := strings.Cut(typ.Field(i).Tag.Get("toml"), ",")
		flag, ok := named[key]
		if !ok {
			flag = strings.ReplaceAll(key, "_", "-")
		}
		if flag != "" && flags.Lookup(flag) == nil {
			t.Errorf("[[nic]] %s: no --%s flag on nic attach", key, flag)
		}
	}
}
