package libvirtimport

import (
	"errors"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// maxRepairs bounds write's attempts (each takes one part out).
const maxRepairs = 64

// repairElement names, by the VM file's top key, the domain element a
// refused key came from.
func repairElement(key string) string {
	switch key {
	case "numa":
		return "cpu/numa"
	case "topology":
		return "cpu/topology"
	case "pinning", "limits":
		return "cputune"
	case "smbios", "credentials":
		return "sysinfo"
	case "boot":
		return "os"
	case "sev":
		return "launchSecurity"
	case "rng_rate":
		return "devices/rng/rate"
	case "max_memory":
		return "maxMemory"
	case "balloon_target":
		return "currentMemory"
	case "hugepages":
		return "memoryBacking/hugepages"
	case "cpu_model":
		return "cpu/model"
	case "max_cpus":
		return "vcpu/@current"
	case "tpm", "vsock", "watchdog", "panic":
		return "devices/" + key
	case "on_panic":
		return "devices/panic"
	}
	return key
}

var keyPart = regexp.MustCompile(`^([a-z_]+)(?:\[([0-9]+)\])?$`)

// repair takes out of the VM file the part the first error of err
// (spec.Parse's) is about, with a line naming its element and the
// error: a list entry (a disk, a NIC, a NUMA node) whole, a key of a
// table or the top level alone. false: nothing to take out (the name,
// the memory: the domain cannot be run at all).
func (c *converter) repair(err error) bool {
	var e *spec.Error
	var list *spec.Errors
	switch {
	case errors.As(err, &list) && len(list.List) > 0:
		e = list.List[0]
	case errors.As(err, &e):
	default:
		return false
	}
	parts := strings.Split(e.Field, ".")
	m := keyPart.FindStringSubmatch(parts[0])
	why := "vmsup would refuse it: " + e.Field + ": " + e.Msg
	if m != nil && strings.Contains(e.Msg, "hugepages") && c.out.Hugepages != "" {
		c.out.Hugepages = "" // memory that is no whole number of pages
		c.drop("memoryBacking/hugepages", "%s", why)
		return true
	}
	if m == nil || m[1] == "name" || m[1] == "memory" || m[1] == "cpus" {
		return false
	}
	v := reflect.ValueOf(&c.out).Elem()
	f, ok := fieldByKey(v, m[1])
	if !ok {
		return false
	}
	if f.Kind() == reflect.Slice && m[2] != "" {
		i, _ := strconv.Atoi(m[2])
		if i >= f.Len() {
			return false
		}
		el := elementOf(f.Index(i), m[1], i)
		f.Set(reflect.AppendSlice(f.Slice(0, i), f.Slice(i+1, f.Len())))
		c.drop(el, "%s", why)
		return true
	}
	el := repairElement(m[1])
	if len(parts) > 1 && m[2] == "" {
		if s := reflect.Indirect(f); s.Kind() == reflect.Struct {
			if sub, ok := fieldByKey(s, parts[1]); ok && !sub.IsZero() {
				sub.SetZero()
				c.note(el, "%s", why)
				return true
			}
		}
	}
	if f.IsZero() {
		return false
	}
	f.SetZero()
	c.drop(el, "%s", why)
	return true
}

// fieldByKey is the field of struct v whose TOML key is key.
func fieldByKey(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
		if name == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// elementOf is the domain element a list entry came from: its el field
// when it has one, else the list's key and index.
func elementOf(v reflect.Value, key string, i int) string {
	if f := v.FieldByName("el"); f.IsValid() && f.String() != "" {
		return f.String()
	}
	return repairElement(key) + "[" + strconv.Itoa(i) + "]"
}
