package libvirtimport

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The structural check: every element and attribute of the domain XML as
// written is either read by the conversion (known.go), inside something a
// line says was not carried over (converter.drop), or listed here as not
// read. So an element or attribute libvirt adds later is never lost in
// silence: it is listed until the conversion learns it.

// xmlNode is one element of the XML as written.
type xmlNode struct {
	name     string // local name; "qemu:NAME" in libvirt's QEMU namespace
	attrs    []xml.Attr
	children []*xmlNode
}

// qemuNS is the namespace of libvirt's <qemu:commandline> and kin.
const qemuNS = "http://libvirt.org/schemas/domain/qemu/1.0"

// parseTree reads the element tree of data.
func parseTree(data []byte) (*xmlNode, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	var stack []*xmlNode
	var root *xmlNode
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			n := &xmlNode{name: elementName(t.Name), attrs: t.Attr}
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				p.children = append(p.children, n)
			} else if root == nil {
				root = n
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if root == nil {
		return nil, fmt.Errorf("no root element")
	}
	return root, nil
}

func elementName(n xml.Name) string {
	switch n.Space {
	case "":
		return n.Local
	case qemuNS:
		return "qemu:" + n.Local
	}
	return n.Space + ":" + n.Local
}

// seg is one step of a path: an element and its place among its
// siblings of that name, or an attribute ("@name").
type seg struct {
	name   string
	lo, hi int  // index range; -1: any
	show   bool // the index is written (siblings share the name, or a device)
}

// parsePath reads a line's element ("devices/disk[2] (vdc)",
// "devices/disk[3..9]", "cpu/feature", "vcpu/@cpuset") into segments; a
// segment without an index stands for any.
func parsePath(el string) []seg {
	if i := strings.Index(el, " ("); i >= 0 {
		el = el[:i]
	}
	var out []seg
	for _, p := range strings.Split(el, "/") {
		s := seg{name: p, lo: -1, hi: -1}
		if i := strings.IndexByte(p, '['); i > 0 && strings.HasSuffix(p, "]") {
			s.name = p[:i]
			idx := p[i+1 : len(p)-1]
			a, b, isRange := strings.Cut(idx, "..")
			lo, err1 := strconv.Atoi(a)
			hi, err2 := strconv.Atoi(b)
			switch {
			case err1 != nil: // a predicate: any
			case !isRange:
				s.lo, s.hi = lo, lo
			case err2 == nil:
				s.lo, s.hi = lo, hi
			}
		}
		out = append(out, s)
	}
	return out
}

// covers reports whether the line at d is about the node at p or
// something above it.
func covers(d, p []seg) bool {
	if len(d) > len(p) {
		return false
	}
	for i, s := range d {
		if s.name != p[i].name || (s.lo >= 0 && (p[i].lo < s.lo || p[i].lo > s.hi)) {
			return false
		}
	}
	return true
}

// unread walks root and returns a line for each element (with what is
// below it) and each attribute that is neither known nor covered.
func unread(root *xmlNode, known map[string]bool, covered [][]seg) []Dropped {
	w := &walker{known: known, covered: covered}
	w.attrs(root, nil, "")
	w.children(root, nil, "")
	return w.out
}

type walker struct {
	known   map[string]bool
	covered [][]seg
	out     []Dropped
}

func (w *walker) isCovered(p []seg) bool {
	for _, d := range w.covered {
		if covers(d, p) {
			return true
		}
	}
	return false
}

// children visits n's child elements; path and key are n's (key without
// indexes, as known.go writes it).
func (w *walker) children(n *xmlNode, path []seg, key string) {
	count := map[string]int{}
	total := map[string]int{}
	for _, c := range n.children {
		total[c.name]++
	}
	for _, c := range n.children {
		i := count[c.name]
		count[c.name]++
		p := append(append([]seg(nil), path...), seg{name: c.name, lo: i, hi: i, show: total[c.name] > 1 || key == "devices"})
		k := joinKey(key, c.name)
		if w.isCovered(p) {
			continue
		}
		if !w.known[k] && !w.known["*/"+c.name] {
			w.out = append(w.out, Dropped{Element: showPath(p), Why: "vmsup import does not read this element: it is not carried over"})
			continue
		}
		w.attrs(c, p, k)
		w.children(c, p, k)
	}
}

// attrs lists n's attributes that are not known.
func (w *walker) attrs(n *xmlNode, path []seg, key string) {
	for _, a := range n.attrs {
		if a.Name.Space == "xmlns" || (a.Name.Space == "" && a.Name.Local == "xmlns") {
			continue
		}
		name := "@" + a.Name.Local
		if w.known[joinKey(key, name)] || w.known["*/"+n.name+"/@*"] {
			continue
		}
		p := append(append([]seg(nil), path...), seg{name: name, lo: -1, hi: -1})
		if w.isCovered(p) {
			continue
		}
		w.out = append(w.out, Dropped{Element: showPath(p), Why: fmt.Sprintf("%q: vmsup import does not read this attribute: its setting is lost", a.Value)})
	}
}

func joinKey(key, name string) string {
	if key == "" {
		return name
	}
	return key + "/" + name
}

// showPath writes p as lines name it.
func showPath(p []seg) string {
	var b strings.Builder
	for i, s := range p {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(s.name)
		if s.show {
			fmt.Fprintf(&b, "[%d]", s.lo)
		}
	}
	return b.String()
}

// guestPCIAddresses reports whether a device of root has a guest PCI
// address of libvirt's (devices/X/address type='pci'; a hostdev's host
// address is under its source).
func guestPCIAddresses(root *xmlNode) bool {
	for _, dv := range root.children {
		if dv.name != "devices" {
			continue
		}
		for _, dev := range dv.children {
			for _, a := range dev.children {
				if a.name == "address" && attr(a, "type") == "pci" {
					return true
				}
			}
		}
	}
	return false
}

func attr(n *xmlNode, name string) string {
	for _, a := range n.attrs {
		if a.Name.Space == "" && a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
