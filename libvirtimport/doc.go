// Package libvirtimport turns a libvirt domain XML (as `virsh dumpxml` or
// `virt-install --print-xml` write it) into a vmsup VM file, and lists every
// element it could not carry over, each with why. It parses the XML with
// libvirt's own Go bindings (libvirt.org/go/libvirtxml) and checks its
// output with spec.Parse, so what it writes always loads.
//
// Secrets stay where libvirt keeps them: a disk's cephx key becomes a
// reference to libvirt's secret file, never a copy.
package libvirtimport
