package main

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/util/jsonschema"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// cliAPIPairs are the CLI's commands and the API's operations that answer
// the same question (or, disk ls and nic ls, a part of it). cli is the Go type the command prints with --json
// (one document, or one line of a stream); apiItem takes from the route's
// result type the one the CLI prints; doc takes from the route's result
// schema in openapi.json the schema of that document (or line).
var cliAPIPairs = []struct {
	cmd, route string
	cli        reflect.Type
	apiItem    func(result reflect.Type) reflect.Type
	doc        func(result *openapi3.Schema) *openapi3.Schema
}{
	{"events", "GET /v1/events", reflect.TypeFor[supervisor.Event](), same, sameDoc},
	{"stats", "GET /v1/stats", reflect.TypeFor[[]supervisor.VMStats](), field("VMs"), fieldDoc("vms")},
	{"ls", "GET /v1/vms", reflect.TypeFor[[]supervisor.Status](), same, sameDoc},
	{"status", "GET /v1/vms/{name}", reflect.TypeFor[supervisor.Status](), same, sameDoc},
	{"plan", "POST /v1/plan", reflect.TypeFor[[]supervisor.PlanResult](), sliceOf, arrayDoc},
	{"snapshot ls", "GET /v1/vms/{name}/snapshots", reflect.TypeFor[supervisor.SnapshotTree](), same, sameDoc},
	// disk ls and nic ls print status's disks and nics.
	{"disk ls", "GET /v1/vms/{name}", reflect.TypeFor[[]supervisor.DiskInfo](), field("Disks"), fieldDoc("disks")},
	{"nic ls", "GET /v1/vms/{name}", reflect.TypeFor[[]supervisor.NICInfo](), field("NICs"), fieldDoc("nics")},
}

func same(t reflect.Type) reflect.Type    { return t }
func sliceOf(t reflect.Type) reflect.Type { return reflect.SliceOf(t) }
func field(name string) func(reflect.Type) reflect.Type {
	return func(t reflect.Type) reflect.Type { f, _ := t.FieldByName(name); return f.Type }
}

func sameDoc(s *openapi3.Schema) *openapi3.Schema { return s }
func arrayDoc(s *openapi3.Schema) *openapi3.Schema {
	return openapi3.NewArraySchema().WithItems(s)
}
func fieldDoc(name string) func(*openapi3.Schema) *openapi3.Schema {
	return func(s *openapi3.Schema) *openapi3.Schema {
		if len(s.AllOf) == 1 { // a nullable $ref
			s = s.AllOf[0].Value
		}
		return s.Properties[name].Value
	}
}

// TestCLIAndAPIShareSchema: for each pair, the CLI's --json document and
// the API's answer have one schema (internal/util/jsonschema, the generator of
// openapi.json, on both types): the CLI prints the API's own types.
func TestCLIAndAPIShareSchema(t *testing.T) {
	routes := map[string]reflect.Type{}
	for _, rt := range (&remoteapi.Server{}).Routes() {
		if rt.Result != nil {
			routes[rt.Pattern] = reflect.TypeOf(rt.Result)
		}
	}
	for _, p := range cliAPIPairs {
		res, ok := routes[p.route]
		if !ok {
			t.Errorf("%s: no route %s with a result", p.cmd, p.route)
			continue
		}
		cg, ag := jsonschema.New("#/"), jsonschema.New("#/")
		cs, as := cg.Schema(p.cli), ag.Schema(p.apiItem(res))
		if d := cmp.Diff(map[string]any{"schema": as, "defs": ag.Defs}, map[string]any{"schema": cs, "defs": cg.Defs}); d != "" {
			t.Errorf("vmsup %s --json and %s differ (-api +cli):\n%s", p.cmd, p.route, d)
		}
	}
}

// TestCLIJSONSchemaOnce: a command the API answers too is described by
// openapi.json alone, not again in docs/cli-json.schema.json.
func TestCLIJSONSchemaOnce(t *testing.T) {
	s := cliSchemaFile(t)
	for _, p := range cliAPIPairs {
		if _, ok := s.Commands[p.cmd]; ok {
			t.Errorf("docs/cli-json.schema.json describes %q, which remoteapi/openapi.json describes (%s): take it out", p.cmd, p.route)
		}
		if _, lines := apiDocSchema(t, p.cmd); lines != (p.cmd == "events") {
			t.Errorf("%s: %s streams: %v", p.cmd, p.route, lines)
		}
	}
}

// cliSchema is docs/cli-json.schema.json: the commands the API does not
// have.
type cliSchema struct {
	Commands map[string]map[string]any `json:"commands"`
	Defs     map[string]map[string]any `json:"$defs"`
}

func cliSchemaFile(t *testing.T) cliSchema {
	t.Helper()
	var s cliSchema
	b, err := os.ReadFile("../../docs/cli-json.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("docs/cli-json.schema.json: %v", err)
	}
	return s
}

// apiDocSchema is the schema in remoteapi/openapi.json of what vmsup cmd
// --json prints (of each line, lines), nil for a command the API does not
// answer.
func apiDocSchema(t *testing.T, cmd string) (s *openapi3.Schema, lines bool) {
	t.Helper()
	for _, p := range cliAPIPairs {
		if p.cmd != cmd {
			continue
		}
		doc, err := openapi3.NewLoader().LoadFromData(remoteapi.OpenAPI)
		if err != nil {
			t.Fatal(err)
		}
		method, path, _ := strings.Cut(p.route, " ")
		resp := doc.Paths.Find(path).GetOperation(method).Responses.Status(200).Value
		if mt := resp.Content.Get("application/x-ndjson"); mt != nil {
			return p.doc(mt.Schema.Value.Properties["item"].Value), true
		}
		return p.doc(resp.Content.Get("application/json").Schema.Value.Properties["result"].Value), false
	}
	return nil, false
}

// TestAPIDocSchemaStrict: the openapi.json schema a document is checked
// against refuses a key it does not have (the CLI's former "pid") and
// lacks one that is always present.
func TestAPIDocSchemaStrict(t *testing.T) {
	s, _ := apiDocSchema(t, "status")
	good := `{"name": "web", "state": "shut-off", "unit": "vmsup-web.service", "state_dir": "/d", "console_socket": "/c",
		"console_log": "/l", "description": "", "disks": [], "nics": []}`
	for doc, want := range map[string]string{
		good: "",
		strings.Replace(good, `"name": "web",`, `"name": "web", "pid": 42,`, 1): `pid`,
		strings.Replace(good, `"unit": "vmsup-web.service",`, "", 1):            `unit`,
	} {
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		err := s.VisitJSON(v)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", doc, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want an error naming %s", doc, err, want)
		}
	}
}
