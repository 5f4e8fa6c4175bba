// Package libvirtimport turns a libvirt domain XML (as `virsh dumpxml` or
// `virt-install --print-xml` write it) into a vmsup VM file, and lists every
// element it could not carry over, or carried differently, each with why. It
// parses the XML with libvirt's own Go bindings (libvirt.org/go/libvirtxml)
// and checks its output with spec.Parse, so what it writes always loads (a
// value spec refuses takes its device out, with a line).
//
// The list is structural (walk.go): the XML as written is walked against
// the paths the conversion reads (known.go) and the lines it made; every
// other element and attribute is listed with its value.
//
// Secrets stay where libvirt keeps them: a disk's cephx key becomes a
// reference to libvirt's secret file, never a copy.
package libvirtimport
