package remoteapi

import (
	"bytes"
	"encoding"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite openapi.json from the routes and Go types")

// TestOpenAPIGolden: openapi.json is what Routes and the Go types of their
// bodies and results say (go test ./remoteapi -run OpenAPI -update rewrites
// it), and a valid OpenAPI 3 document.
func TestOpenAPIGolden(t *testing.T) {
	got := openAPIDoc(t)
	if *update {
		if err := os.WriteFile("openapi.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if d := cmp.Diff(string(OpenAPI), string(got)); d != "" {
		t.Errorf("openapi.json is stale (go test ./remoteapi -run OpenAPI -update): -file +generated\n%s", d)
	}
	doc, err := openapi3.NewLoader().LoadFromData(got)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
}

type schemaGen struct{ comps map[string]any }

var (
	timeType = reflect.TypeFor[time.Time]()
	textType = reflect.TypeFor[encoding.TextMarshaler]()
	jsonType = reflect.TypeFor[json.Marshaler]()
)

// schema is the JSON schema of what encoding/json makes of a value of t.
func (g *schemaGen) schema(t reflect.Type) map[string]any {
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
		s := g.schema(t.Elem())
		if ref, ok := s["$ref"]; ok {
			return map[string]any{"allOf": []any{map[string]any{"$ref": ref}}, "nullable": true}
		}
		s["nullable"] = true
		return s
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "format": "byte", "nullable": true}
		}
		return map[string]any{"type": "array", "items": g.schema(t.Elem()), "nullable": true}
	case reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem()), "nullable": true}
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
		name := t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:] + "." + t.Name()
		if _, ok := g.comps[name]; !ok {
			g.comps[name] = nil // recursion
			g.comps[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	panic("openapi: no schema for " + t.String())
}

// object is a struct's schema: its JSON fields (embedded ones inlined),
// all present unless omitempty, no others.
func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	required := []string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
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
			props[name] = g.schema(f.Type)
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

var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

// openAPIDoc generates the document from Routes.
func openAPIDoc(t *testing.T) []byte {
	g := &schemaGen{comps: map[string]any{}}
	errSchema := g.schema(reflect.TypeFor[Error]())
	nullErr := map[string]any{"allOf": []any{errSchema}, "nullable": true}
	paths := map[string]map[string]any{}
	for _, rt := range (&Server{}).Routes() {
		method, p, _ := strings.Cut(rt.Pattern, " ")
		op := map[string]any{"summary": rt.Summary, "operationId": strings.ToLower(method) + strings.NewReplacer("/", "_", "{", "", "}", "", ".", "_").Replace(p)}
		var params []any
		for _, m := range pathParam.FindAllStringSubmatch(p, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range rt.Query {
			s := map[string]any{"type": "string"}
			if q == "name" {
				s = map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
			}
			params = append(params, map[string]any{"name": q, "in": "query", "schema": s})
		}
		if params != nil {
			op["parameters"] = params
		}
		if rt.Body != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.Body))}}}
		}
		result := map[string]any{"nullable": true}
		if rt.Result != nil {
			result = g.schema(reflect.TypeOf(rt.Result))
			result["nullable"] = true
			if ref, ok := result["$ref"]; ok {
				result = map[string]any{"allOf": []any{map[string]any{"$ref": ref}}, "nullable": true}
			}
		}
		answer := map[string]any{"type": "object", "additionalProperties": false, "required": []string{"result", "error"},
			"properties": map[string]any{"result": result, "error": nullErr}}
		ok := map[string]any{"description": "done", "content": map[string]any{"application/json": map[string]any{"schema": answer}}}
		if rt.Stream {
			line := map[string]any{"type": "object", "additionalProperties": false, "description": "one line of NDJSON: an item, or last the end with its error",
				"properties": map[string]any{"item": result, "end": map[string]any{"type": "boolean"}, "error": nullErr}}
			ok = map[string]any{"description": "the items, one JSON object a line, then the end line", "content": map[string]any{"application/x-ndjson": map[string]any{"schema": line}}}
		}
		if rt.Pattern == "GET /v1/openapi.json" {
			ok = map[string]any{"description": "this document", "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}}}
		}
		failed := map[string]any{"type": "object", "additionalProperties": false, "required": []string{"result", "error"},
			"properties": map[string]any{"result": result, "error": errSchema}}
		op["responses"] = map[string]any{"200": ok, "default": map[string]any{"description": "failed: the error, and for up, plan, apply and restart what was done", "content": map[string]any{"application/json": map[string]any{"schema": failed}}}}
		if paths[p] == nil {
			paths[p] = map[string]any{}
		}
		paths[p][strings.ToLower(method)] = op
	}
	doc := map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "vmsup remote API", "version": "1",
			"description": "The operations of the vmsup CLI over HTTP+JSON (docs/remote-api.md). TCP: mutual TLS, the client's certificate names it (cn:NAME); the local unix socket: its user (uid:N). Results are the supervisor's Go types as encoding/json writes them; errors are the CLI's --json errors."},
		"paths":      paths,
		"components": map[string]any{"schemas": g.comps},
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
