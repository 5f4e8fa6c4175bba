package spec

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// maxDecodeRounds bounds the decodes of one file: each round after the
// first leaves out one more value of the wrong type (a round of a file of
// MaxKeys keys takes about 15 ms).
const maxDecodeRounds = 16

// decodeVM decodes f.Raw into f.VM strictly, in rounds: go-toml stops at
// the first value of the wrong type, so that value is reported, blanked
// out (spaces, so every position stays) and the rest decoded again, until
// the file decodes or only unknown keys are left (reported together). The
// keys reported are added to f.bad: their defaults stand in, and the value
// checks leave them alone. ok is false when the file could not be decoded
// at all (TOML syntax, a table of the wrong kind, too many rounds).
func (f *File) decodeVM() (errs []*Error, ok bool) {
	data := f.Raw
	blanked := map[string]bool{}
	blank := func(field string, start, end int) {
		if len(blanked) == 0 {
			data = bytes.Clone(f.Raw) // f.Raw stays what the user wrote
		}
		for i := start; i < end; i++ {
			if data[i] != '\n' && data[i] != '\r' {
				data[i] = ' '
			}
		}
		blanked[field] = true
		f.bad = append(f.bad, field)
	}
	// A duration written as a bare number would decode, as nanoseconds.
	for _, e := range f.bareDurations() {
		errs = append(errs, e)
		p := f.pos[e.Field]
		blank(e.Field, p.start, p.end)
	}
	for range maxDecodeRounds {
		var vm VM
		err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(&vm)
		var sm *toml.StrictMissingError
		switch {
		case err == nil:
			f.VM = vm
			return errs, true
		case errors.As(err, &sm) && len(sm.Errors) > 0:
			// Reported after the whole document was decoded.
			f.VM = vm
			unknown, meant := f.unknownKeys(sm, err, reflect.TypeOf(VM{}))
			f.bad = append(f.bad, meant...)
			return append(errs, unknown...), true
		}
		e := f.typeError(err, reflect.TypeOf(VM{}), blanked)
		errs = append(errs, e)
		start, end := f.valueRange(e)
		if end <= start {
			return errs, false
		}
		blank(e.Field, start, end)
	}
	return errs, false
}

// typeError is the one error of a decode that is not about unknown keys:
// a value of the wrong type, a bad size or duration, or TOML syntax.
func (f *File) typeError(err error, root reflect.Type, blanked map[string]bool) *Error {
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		k, _ := f.keyAt(de.Key(), row, col)
		return &Error{File: f.Path, Pos: Position{row, col}, Field: k,
			Msg: plainDecodeMsg(strings.TrimPrefix(de.Error(), "toml: ")), Err: err}
	}
	// Errors from a value's UnmarshalText for a non-string TOML value (memory =
	// true) come without a position: find the key whose value was that text,
	// the first in the file of those that take a size or a duration.
	var ve *valueError
	if errors.As(err, &ve) {
		textKeys := map[string]bool{}
		typedKeys(root, "", textKeys, sizeType, durationType)
		var found *Error
		for k, p := range f.pos {
			if p.value != ve.text || p.kind == unstable.String || blanked[k] || !textKeys[indexRE.ReplaceAllString(k, "[]")] {
				continue
			}
			if found == nil || before(p.Position, found.Pos) {
				found = &Error{File: f.Path, Pos: p.Position, Field: k, Msg: ve.Error(), Err: err}
			}
		}
		if found != nil {
			return found
		}
	}
	return &Error{File: f.Path, Msg: err.Error(), Err: err}
}

// valueRange is where the key-value e is about is written in f.Raw: its
// own entry, or the one around e's position (a key inside an inline
// table). end <= start when there is none: a table header, a syntax error.
func (f *File) valueRange(e *Error) (start, end int) {
	if e.Field == "" {
		return 0, 0
	}
	if p, ok := f.pos[e.Field]; ok {
		return p.start, p.end
	}
	if e.Pos.Line == 0 {
		return 0, 0
	}
	lines := lineStarts(f.Raw)
	if e.Pos.Line > len(lines) {
		return 0, 0
	}
	off := lines[e.Pos.Line-1] + e.Pos.Col - 1
	for _, p := range f.pos {
		if p.start <= off && off < p.end {
			return p.start, p.end
		}
	}
	return 0, 0
}

// unknownKeys reports every unknown key of a strict decode, and the keys
// they were probably meant to be (a near spelling, the table where the key
// belongs): those are missing because of the misspelling, not on their own.
func (f *File) unknownKeys(sm *toml.StrictMissingError, err error, root reflect.Type) (errs []*Error, meant []string) {
	known := map[string]bool{}
	knownKeys(root, "", known)
	for _, de := range sm.Errors {
		row, col := de.Position()
		k, pos := f.keyAt(de.Key(), row, col)
		msg, keys := unknownKeyMsg(indexRE.ReplaceAllString(k, "[]"), known)
		table, _ := cutLast(k)
		for _, m := range keys {
			if mt, leaf := cutLast(m); mt == indexRE.ReplaceAllString(table, "[]") {
				m = table + leaf // disk[1].fiel meant disk[1].file
			}
			if i := strings.Index(m, "[]"); i >= 0 {
				m = m[:i] // a key of some [[disk]]: the disks
			}
			meant = append(meant, m)
		}
		errs = append(errs, &Error{File: f.Path, Pos: pos, Field: k, Msg: msg, Err: err})
	}
	return errs, meant
}

func before(a, b Position) bool { return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col }

// Err is every problem ParsePartial found in f, as Parse would have
// returned them; nil for a file from Parse, Load or New.
func (f *File) Err() error {
	if len(f.errs) == 0 {
		return nil
	}
	return f.joinErrors(append([]*Error(nil), f.errs...))
}

// Broken reports whether a problem of f (ParsePartial) concerns field
// ("disk[1]", "memory"), a key inside it or the table it is in: a check of
// the host (does the disk's image exist?) skips what is already wrong.
func (f *File) Broken(field string) bool {
	for _, e := range f.errs {
		if related(e.Field, field) {
			return true
		}
	}
	for _, b := range f.bad {
		if related(b, field) {
			return true
		}
	}
	return false
}

// related: a and b are one key, or one is a table holding the other.
func related(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	inside := func(outer, inner string) bool {
		return strings.HasPrefix(inner, outer) && len(inner) > len(outer) && (inner[len(outer)] == '.' || inner[len(outer)] == '[')
	}
	return a == b || inside(a, b) || inside(b, a)
}

// Join is the problems with f found by f.Err and by later checks (the
// host's), one per line in file order: nil, the one error as it is, or an
// *Errors. A later check's error about a field that already has a problem
// in f is left out (it follows from that one), and so is one whose text
// was said already; errors that are not an *Error are kept, one *Error
// per line of their text.
func (f *File) Join(errs ...error) error {
	own := map[*Error]bool{}
	for _, e := range f.errs {
		own[e] = true
	}
	var list []*Error
	var orig []error
	said := map[string]bool{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		for _, e := range f.asErrors(err) {
			if !own[e] && f.Broken(e.Field) || said[e.Error()] {
				continue // follows from a problem of the file, or said already
			}
			said[e.Error()] = true
			list = append(list, e)
		}
		orig = append(orig, err)
	}
	if len(list) == 1 && len(orig) == 1 {
		return orig[0] // as its check wrote it
	}
	return f.joinErrors(list)
}

// asErrors flattens err into *Errors' items.
func (f *File) asErrors(err error) []*Error {
	switch e := err.(type) {
	case *Error:
		return []*Error{e}
	case *Errors:
		return e.List
	}
	var out []*Error
	for _, line := range strings.Split(strings.TrimSpace(err.Error()), "\n") {
		out = append(out, &Error{File: f.Path, Msg: strings.TrimPrefix(line, f.Path+": "), Err: err})
	}
	return out
}

var sizeType = reflect.TypeOf(Size(0))

// typedKeys collects the key paths ("memory", "disk[].size") of the
// fields of t with one of types.
func typedKeys(t reflect.Type, prefix string, out map[string]bool, types ...reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		fl := t.Field(i)
		name, _, _ := strings.Cut(fl.Tag.Get("toml"), ",")
		ft := fl.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if name == "" && fl.Anonymous && ft.Kind() == reflect.Struct {
			typedKeys(ft, prefix, out, types...) // embedded: its keys are the table's
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		switch {
		case slices.Contains(types, ft):
			out[prefix+name] = true
		case ft.Kind() == reflect.Struct:
			typedKeys(ft, prefix+name+".", out, types...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			typedKeys(ft.Elem(), prefix+name+"[].", out, types...)
		}
	}
}
