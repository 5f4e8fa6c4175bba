package main

import (
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/jsonschema"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// cliAPIPairs are the CLI's commands and the API's operations that answer
// the same question: what the command prints with --json (one document,
// one line of a stream, or one item of its array) and the route's result
// (or one item of it).
var cliAPIPairs = []struct {
	cmd, route string
	cli        reflect.Type
	apiItem    func(result reflect.Type) reflect.Type
}{
	{"events", "GET /v1/events", reflect.TypeFor[supervisor.Event](), same},
	{"stats", "GET /v1/stats", reflect.TypeFor[supervisor.VMStats](), field("VMs")},
	{"ls", "GET /v1/vms", reflect.TypeFor[statusJSON](), elem},
	{"status", "GET /v1/vms/{name}", reflect.TypeFor[statusJSON](), same},
	{"plan", "POST /v1/plan", reflect.TypeFor[planJSON](), same},
	{"snapshot ls", "GET /v1/vms/{name}/snapshots", reflect.TypeFor[snapshotsJSON](), same},
}

// notShared are the commands whose --json document is still the CLI's own
// rendering of the API's result (every key present, other names), not the
// API's type: the list may only shrink.
var notShared = []string{"ls", "status", "plan", "snapshot ls"}

func same(t reflect.Type) reflect.Type { return t }
func elem(t reflect.Type) reflect.Type { return t.Elem() }
func field(name string) func(reflect.Type) reflect.Type {
	return func(t reflect.Type) reflect.Type { f, _ := t.FieldByName(name); return f.Type.Elem() }
}

// TestCLIAndAPIShareSchema: for each pair, the CLI's --json document and
// the API's answer have one schema (internal/jsonschema, the generator of
// openapi.json, on both types), except the commands of notShared, which
// must differ (a command that converged leaves the list).
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
		d := cmp.Diff(map[string]any{"schema": as, "defs": ag.Defs}, map[string]any{"schema": cs, "defs": cg.Defs})
		switch listed := slices.Contains(notShared, p.cmd); {
		case d != "" && !listed:
			t.Errorf("vmsup %s --json and %s differ (-api +cli):\n%s", p.cmd, p.route, d)
		case d == "" && listed:
			t.Errorf("vmsup %s --json and %s now share their schema: take %q out of notShared", p.cmd, p.route, p.cmd)
		}
	}
}
