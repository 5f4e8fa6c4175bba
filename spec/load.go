package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/vmsup/vmsup/internal/host/userfile"
)

// File is a parsed VM description together with where it came from, so later
// checks (by the supervisor) can report errors at the right line.
type File struct {
	Path string // as given by the user
	Raw  []byte // the exact bytes parsed
	VM   VM
	pos  map[string]keyPos
	errs []*Error // what ParsePartial found
	bad  []string // fields whose values were left out or misspelt: no value checks
	// origins: where each value of a file with includes came from
	// (include.go); nil without includes.
	origins map[string]Origin
}

type keyPos struct {
	Position
	value      string        // raw value text, for KeyValue entries
	kind       unstable.Kind // the value's TOML kind, for KeyValue entries
	start, end int           // the bytes of the whole "key = value", for KeyValue entries
}

// Position is a place in a TOML file (1-based).
type Position struct{ Line, Col int }

// Error is a problem with one field of one file. Its text is one line:
// "web.toml:12:8: disk[1].file: /x.qcow2: no such file".
type Error struct {
	File  string
	Pos   Position // zero when unknown
	Field string   // "memory", "disk[1].file"; empty for whole-file problems
	Msg   string
	Err   error // optional underlying error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Pos.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Pos.Line, e.Pos.Col)
	}
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	b.WriteString(": ")
	b.WriteString(oneLine(e.Msg))
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Load reads and parses the TOML file at path. Relative paths inside it are
// resolved against the file's directory.
func Load(path string) (*File, error) {
	f, err := LoadPartial(path)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// LoadPartial is Load for a caller that checks more than the file itself
// (ParsePartial).
func LoadPartial(path string) (*File, error) {
	data, err := userfile.Read(path, userfile.MaxSpec)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), path+": ")
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == path {
			msg = pe.Err.Error() // "no such file or directory", not "open PATH: ..."
		}
		return nil, &Error{File: path, Msg: msg, Err: err}
	}
	return ParsePartial(path, data)
}

// MaxKeys bounds the keys of one file: a VM with many disks has a few
// hundred; strict decoding of unknown keys costs more than linear time.
const MaxKeys = 4096

// Parse parses data as if it were the file at path: strict (unknown keys are
// errors), defaults filled, relative paths made absolute against path's
// directory, and the result validated. The error names every problem of
// the file, in file order (an *Errors when there are several).
func Parse(path string, data []byte) (*File, error) {
	f, err := ParsePartial(path, data)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// ParsePartial is Parse for a caller that checks more than the file itself
// (the supervisor's Validate, which then looks at the host): when the
// problems are in fields, it returns the file as far as it could be read
// together with its errors (Parse's), the values of the wrong type left
// out. f.Err repeats the errors and f.Broken says which fields they
// concern. A file that cannot be read at all (TOML syntax, too large) is
// nil.
func ParsePartial(path string, data []byte) (*File, error) {
	f := &File{Path: path, Raw: data}
	if len(data) > userfile.MaxSpec {
		return nil, &Error{File: path, Msg: fmt.Sprintf("%d bytes, more than the %d KiB vmsup reads", len(data), userfile.MaxSpec>>10)}
	}
	if hasInclude(data) {
		merged, origins, err := mergeIncludes(path, data)
		if err != nil {
			return nil, err
		}
		f.Raw, f.origins, data = merged, origins, merged
	}
	// Positions first: one linear pass that also bounds the key count
	// before the (costlier) strict decode.
	f.pos = positions(data)
	if len(f.pos) > MaxKeys {
		return nil, &Error{File: path, Msg: fmt.Sprintf("%d keys, more than the %d vmsup reads", len(f.pos), MaxKeys)}
	}
	errs, ok := f.decodeVM()
	if !ok {
		return nil, f.joinErrors(errs)
	}
	if _, set := f.pos["stop_timeout"]; set && f.VM.StopTimeout == 0 && !f.Broken("stop_timeout") {
		// Not "the default": a zero that meant 60 s surprised users.
		errs = append(errs, f.Errorf("stop_timeout", "0s: must be more than 0s (leave it out for the default %s)", DefaultStopTimeout))
		f.bad = append(f.bad, "stop_timeout")
	}
	f.VM.applyDefaults()
	f.resolvePaths()
	f.errs = append(errs, f.validateList()...)
	if len(f.errs) == 0 {
		return f, nil
	}
	return f, f.Err()
}

// Errorf returns an *Error for field (as named in error messages, e.g.
// "disk[1].file"), with its position in the file when known.
func (f *File) Errorf(field string, format string, args ...any) *Error {
	e := &Error{File: f.Path, Field: field, Msg: fmt.Sprintf(format, args...), Pos: f.lookup(field)}
	if e.Pos.Line == 0 && f.Raw != nil {
		e.Pos = Position{1, 1} // a key not written (missing): the file's start, as compilers do
	}
	f.placeAt(e)
	for _, a := range args {
		if err, ok := a.(error); ok {
			e.Err = err
		}
	}
	return e
}

func (f *File) lookup(field string) Position {
	for field != "" {
		if p, ok := f.pos[field]; ok {
			return p.Position
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return Position{}
}

// decodeError is the error of a one-round strict decode into root (a disk
// file: ParseDisk).
func (f *File) decodeError(err error, root reflect.Type) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) && len(sm.Errors) > 0 {
		errs, _ := f.unknownKeys(sm, err, root)
		return f.joinErrors(errs)
	}
	return f.typeError(err, root, nil)
}

func (f *File) resolvePaths() {
	// Against the file's absolute directory: "vmsup up rel.toml" must mean
	// the same as "vmsup up $PWD/rel.toml".
	dir, err := filepath.Abs(filepath.Dir(f.Path))
	if err != nil {
		dir = filepath.Dir(f.Path)
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	for _, p := range f.VM.HostPaths() {
		*p.Ptr = abs(*p.Ptr)
	}
	for i := range f.VM.Shares { // a share's root is compared as a directory
		if p := f.VM.Shares[i].Path; p != "" {
			f.VM.Shares[i].Path = filepath.Clean(abs(p))
		}
	}
}

// positions maps every key path in data ("memory", "boot.kernel",
// "disk[1].file") to where it is written, using go-toml's parser so error
// messages from later checks can still say file:line:col.
func positions(data []byte) map[string]keyPos {
	out := map[string]keyPos{}
	var p unstable.Parser
	p.Reset(data)
	lines := lineStarts(data)
	nodePos := func(it unstable.Iterator) Position { return nodePosition(&p, lines, it) }
	table := ""
	arrays := map[string]int{}
	for p.NextExpression() {
		n := p.Expression()
		switch n.Kind {
		case unstable.Table, unstable.ArrayTable:
			name := joinKey(n.Key())
			if n.Kind == unstable.ArrayTable {
				idx := arrays[name]
				arrays[name] = idx + 1
				name = name + "[" + strconv.Itoa(idx) + "]"
			}
			table = name
			out[table] = keyPos{Position: nodePos(n.Key())}
		case unstable.KeyValue:
			k := joinKey(n.Key())
			if table != "" {
				k = table + "." + k
			}
			start := int(n.Raw.Offset)
			out[k] = keyPos{Position: nodePos(n.Key()), value: string(n.Value().Data), kind: n.Value().Kind,
				start: start, end: start + int(n.Raw.Length)}
			if len(out) > MaxKeys {
				return out // Parse refuses the file
			}
		}
	}
	return out
}

func joinKey(it unstable.Iterator) string {
	var parts []string
	for it.Next() {
		parts = append(parts, string(it.Node().Data))
	}
	return strings.Join(parts, ".")
}

// nodePosition is where a key starts. Computed from its offset with the
// file's line starts (the parser's own Shape rescans the file from the
// start for each key: quadratic in the file's size).
func nodePosition(p *unstable.Parser, lines []int, it unstable.Iterator) Position {
	if !it.Next() {
		return Position{}
	}
	n := it.Node()
	r := n.Raw
	if r.Length == 0 {
		r = p.Range(n.Data)
	}
	off := int(r.Offset)
	i := sort.SearchInts(lines, off+1) - 1 // the last line starting at or before off
	return Position{Line: i + 1, Col: off - lines[i] + 1}
}

// lineStarts are the offsets where the lines of data start.
func lineStarts(data []byte) []int {
	starts := []int{0}
	for i, c := range data {
		if c == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// New checks a VM built in Go exactly as Parse checks a file: it is written
// out as TOML (File.Raw, what vmsup records) and parsed back, so defaults,
// validation and errors are the same. source names it in errors, like a
// file path ("web" or "main.go"); relative paths in vm are taken against
// source's directory (for a bare name, the current directory).
func New(source string, vm VM) (*File, error) {
	vm.Disks = append([]Disk(nil), vm.Disks...) // the caller's slices stay as they are
	vm.NICs = append([]NIC(nil), vm.NICs...)
	vm.applyDefaults() // zero values as "not set", not as written zeros
	raw, err := toml.Marshal(vm)
	if err != nil {
		return nil, &Error{File: source, Msg: err.Error(), Err: err}
	}
	return Parse(source, raw)
}

// Validate checks f again, after a program changed f.VM; Parse and New
// already did on the way in.
func (f *File) Validate() error { return f.validate() }
