package remoteapi

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/util/jsonschema"
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

var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

// openAPIDoc generates the document from Routes.
func openAPIDoc(t *testing.T) []byte {
	g := jsonschema.New("#/components/schemas/")
	errSchema := g.Schema(reflect.TypeFor[Error]())
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
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": g.Schema(reflect.TypeOf(rt.Body))}}}
		}
		result := map[string]any{"nullable": true}
		if rt.Result != nil {
			result = jsonschema.Nullable(g.Schema(reflect.TypeOf(rt.Result)))
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
		responses := map[string]any{"200": ok, "default": map[string]any{"description": "failed: the error, and for up, plan, apply and restart what was done", "content": map[string]any{"application/json": map[string]any{"schema": failed}}}}
		if rt.Upgrade {
			delete(responses, "200")
			responses["101"] = map[string]any{"description": "the websocket session: raw bytes both ways in binary messages, until either side closes or stream_timeout"}
		}
		op["responses"] = responses
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
		"components": map[string]any{"schemas": g.Defs},
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
