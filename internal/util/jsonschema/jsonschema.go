// Package jsonschema writes the JSON schema of what encoding/json makes of
// a Go type: one generator for every schema vmsup checks in (the remote
// API's openapi.json components, and the tests comparing the CLI's --json
// documents with the API's answers), so two documents describing one Go
// type cannot say different things. It does not validate documents.
package jsonschema

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"time"
)

// Generator collects the named struct types it meets as definitions
// (Defs), each referred to as RefPrefix+"pkg.Type". Schemas use OpenAPI
// 3.0's "nullable" for what encoding/json may write as null.
type Generator struct {
	RefPrefix string // "#/components/schemas/"
	Defs      map[string]any
}

// New is a Generator whose references start with refPrefix.
func New(refPrefix string) *Generator {
	return &Generator{RefPrefix: refPrefix, Defs: map[string]any{}}
}

var (
	timeType = reflect.TypeFor[time.Time]()
	textType = reflect.TypeFor[encoding.TextMarshaler]()
	jsonType = reflect.TypeFor[json.Marshaler]()
)

// Schema is the JSON schema of what encoding/json makes of a value of t.
func (g *Generator) Schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Implements(jsonType) || reflect.PointerTo(t).Implements(jsonType):
		return map[string]any{}
	case t.Implements(textType) || reflect.PointerTo(t).Implements(textType):
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return Nullable(g.Schema(t.Elem()))
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "format": "byte", "nullable": true}
		}
		return map[string]any{"type": "array", "items": g.Schema(t.Elem()), "nullable": true}
	case reflect.Array:
		return map[string]any{"type": "array", "items": g.Schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.Schema(t.Elem()), "nullable": true}
	case reflect.Interface:
		return map[string]any{}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Struct:
		if t.Name() == "" {
			return g.object(t)
		}
		name := Name(t)
		if _, ok := g.Defs[name]; !ok {
			g.Defs[name] = nil // recursion
			g.Defs[name] = g.object(t)
		}
		return map[string]any{"$ref": g.RefPrefix + name}
	}
	panic("jsonschema: no schema for " + t.String())
}

// Name is a named type's definition name: "supervisor.Status".
func Name(t reflect.Type) string {
	return t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:] + "." + t.Name()
}

// Nullable is s that may also be null (a $ref wrapped in allOf, as
// OpenAPI 3.0 ignores siblings of $ref).
func Nullable(s map[string]any) map[string]any {
	if ref, ok := s["$ref"]; ok {
		return map[string]any{"allOf": []any{map[string]any{"$ref": ref}}, "nullable": true}
	}
	s["nullable"] = true
	return s
}

// object is a struct's schema: its JSON fields (embedded ones inlined),
// all present unless omitempty, no others.
func (g *Generator) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	required := []string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() && !f.Anonymous || f.Type.Kind() == reflect.Func || f.Type.Kind() == reflect.Chan {
				continue
			}
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			if name == "" {
				name = f.Name
			}
			props[name] = g.Schema(f.Type)
			if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
				required = append(required, name)
			}
		}
	}
	walk(t)
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}
