package snapshottree

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Disk is a disk the VM has: its name, its own image (the file of its
// spec), and the directory new overlays for it go to.
type Disk struct {
	Name       string
	Own        Image
	OverlayDir string
}

// Layer is one disk's part of a take or a revert: the new overlay to put
// on Base.
type Layer struct {
	Disk    string `json:"disk"`
	Base    Image  `json:"base"`
	Overlay Image  `json:"overlay"`
}

// PlanTake plans snapshot tag of disks: each disk's active image is frozen
// and gets a new overlay. exists reports whether a path is taken.
func (t *Tree) PlanTake(tag string, disks []Disk, exists func(string) bool) ([]Layer, error) {
	if err := t.CheckTag(tag); err != nil {
		return nil, err
	}
	if len(disks) == 0 {
		return nil, errors.New("the VM has no writable disk to snapshot")
	}
	return t.layers(tag, disks, func(d Disk) Image { return t.ActiveImage(d.Name, d.Own) }, exists), nil
}

// CheckTag checks that tag can name a new snapshot.
func (t *Tree) CheckTag(tag string) error {
	if err := ValidTag(tag); err != nil {
		return err
	}
	if t.Find(tag) != nil {
		return fmt.Errorf("snapshot %q exists", tag)
	}
	return nil
}

func (t *Tree) layers(tag string, disks []Disk, base func(Disk) Image, exists func(string) bool) []Layer {
	taken := map[string]bool{}
	out := make([]Layer, 0, len(disks))
	for _, d := range disks {
		b := base(d)
		p := OverlayPath(d.OverlayDir, d.Own.Path, tag, func(p string) bool { return taken[p] || exists(p) })
		taken[p] = true
		out = append(out, Layer{Disk: d.Name, Base: b,
			Overlay: Image{Path: p, Format: "qcow2", Backing: b.Path, BackingFormat: b.Format}})
	}
	return out
}

// Taken records snapshot s (its Disks are filled from layers) and the
// layers as the disks' active images.
func (t *Tree) Taken(s Snapshot, layers []Layer) {
	s.Parent = t.Current
	s.Disks = map[string]Image{}
	if t.Active == nil {
		t.Active = map[string]Image{}
	}
	for _, l := range layers {
		s.Disks[l.Disk] = l.Base
		t.Active[l.Disk] = l.Overlay
	}
	if s.Created.IsZero() {
		s.Created = time.Now().UTC()
	}
	t.Snapshots = append(t.Snapshots, s)
	t.Current = s.Tag
}

// PlanRevert plans going back to snapshot tag: each of its disks gets a
// new overlay on the image it was frozen in. Disks the snapshot does not
// have (added since) keep running on what they run on.
func (t *Tree) PlanRevert(tag string, disks []Disk, exists func(string) bool) (*Snapshot, []Layer, error) {
	s := t.Find(tag)
	if s == nil {
		return nil, nil, fmt.Errorf("no snapshot %q%s", tag, t.known())
	}
	var in []Disk
	for _, d := range disks {
		if _, ok := s.Disks[d.Name]; ok {
			in = append(in, d)
		}
	}
	for name := range s.Disks {
		if !slices.ContainsFunc(disks, func(d Disk) bool { return d.Name == name }) {
			return nil, nil, fmt.Errorf("snapshot %q has disk %q, which the VM no longer has", tag, name)
		}
	}
	return s, t.layers(tag, in, func(d Disk) Image { return s.Disks[d.Name] }, exists), nil
}

// Reverted makes layers the active images and tag current; it returns the
// overlays no longer used (the writes since, which a revert discards).
func (t *Tree) Reverted(tag string, layers []Layer) (drop []string) {
	var old []Image
	if t.Active == nil {
		t.Active = map[string]Image{}
	}
	for _, l := range layers {
		if im, ok := t.Active[l.Disk]; ok {
			old = append(old, im)
		}
		t.Active[l.Disk] = l.Overlay
	}
	t.Current = tag
	for _, im := range old {
		if im.Backing != "" && !t.Used(im.Path) {
			drop = append(drop, im.Path)
		}
	}
	return drop
}

func (t *Tree) known() string {
	if len(t.Snapshots) == 0 {
		return " (the VM has none)"
	}
	tags := make([]string, len(t.Snapshots))
	for i, s := range t.Snapshots {
		tags[i] = s.Tag
	}
	return " (it has " + strings.Join(tags, ", ") + ")"
}

// Merge is one disk's part of removing a snapshot: its frozen image Into
// takes in the one image built on it (From), which then goes; images on
// From are re-based on Into. From empty: nothing is built on Into, which
// just goes (Drop).
type Merge struct {
	Disk   string   `json:"disk"`
	Into   Image    `json:"into"`
	From   *Image   `json:"from,omitempty"`
	Rebase []string `json:"rebase,omitempty"` // images whose backing is From
	Drop   string   `json:"drop,omitempty"`   // a file to delete
}

// PlanRemove plans removing snapshot tag: for each disk, the one image on
// its frozen image is merged down into it (so the disk's own file takes
// in the snapshots above it as they go). A frozen image with two or more
// images on it (a revert made a branch) cannot be merged into.
func (t *Tree) PlanRemove(tag string) (*Snapshot, []Merge, error) {
	s := t.Find(tag)
	if s == nil {
		return nil, nil, fmt.Errorf("no snapshot %q%s", tag, t.known())
	}
	names := make([]string, 0, len(s.Disks))
	for n := range s.Disks {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []Merge
	for _, n := range names {
		into := s.Disks[n]
		kids := t.on(into.Path)
		m := Merge{Disk: n, Into: into}
		switch len(kids) {
		case 0:
			if into.Backing != "" && !t.usedElsewhere(into.Path, tag) {
				m.Drop = into.Path
			}
		case 1:
			from := kids[0]
			m.From = &from
			m.Drop = from.Path
			for _, k := range t.on(from.Path) {
				m.Rebase = append(m.Rebase, k.Path)
			}
		default:
			paths := make([]string, len(kids))
			for i, k := range kids {
				paths[i] = k.Path
			}
			return nil, nil, fmt.Errorf("disk %q of snapshot %q is the base of %d branches (%s, made by reverts): remove the snapshots of all but one branch first",
				n, tag, len(kids), strings.Join(paths, ", "))
		}
		out = append(out, m)
	}
	return s, out, nil
}

// on lists the distinct managed images whose backing is path.
func (t *Tree) on(path string) []Image {
	seen := map[string]bool{}
	var out []Image
	add := func(im Image) {
		if im.Backing == path && !seen[im.Path] {
			seen[im.Path] = true
			out = append(out, im)
		}
	}
	for _, im := range t.Active {
		add(im)
	}
	for _, s := range t.Snapshots {
		for _, im := range s.Disks {
			add(im)
		}
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Path, b.Path) })
	return out
}

func (t *Tree) usedElsewhere(path, tag string) bool {
	for _, im := range t.Active {
		if im.Path == path {
			return true
		}
	}
	for _, s := range t.Snapshots {
		if s.Tag == tag {
			continue
		}
		for _, im := range s.Disks {
			if im.Path == path {
				return true
			}
		}
	}
	return false
}

// Removed records snapshot tag as gone after merges: every reference to a
// merged image now points to the image it went into, and the snapshots
// taken from tag now come from its parent.
func (t *Tree) Removed(tag string, merges []Merge) {
	s := t.Find(tag)
	if s == nil {
		return
	}
	parent := s.Parent
	t.Snapshots = slices.DeleteFunc(t.Snapshots, func(x Snapshot) bool { return x.Tag == tag })
	for _, m := range merges {
		if m.From == nil {
			continue
		}
		fix := func(im Image) Image {
			if im.Path == m.From.Path {
				// The merged image's place: Into, with what Into stands on.
				return m.Into
			}
			if im.Backing == m.From.Path {
				im.Backing, im.BackingFormat = m.Into.Path, m.Into.Format
			}
			return im
		}
		for d, im := range t.Active {
			t.Active[d] = fix(im)
		}
		for i := range t.Snapshots {
			for d, im := range t.Snapshots[i].Disks {
				t.Snapshots[i].Disks[d] = fix(im)
			}
		}
	}
	for i := range t.Snapshots {
		if t.Snapshots[i].Parent == tag {
			t.Snapshots[i].Parent = parent
		}
	}
	if t.Current == tag {
		t.Current = parent
	}
	for d, im := range t.Active {
		if im.Backing == "" { // back on the disk's own file
			delete(t.Active, d)
		}
	}
}
