package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// --json: every command writes one JSON document to stdout (logs and
// migrate: one per line). Commands that act on VMs write
// {"results": [action...], "error": error|null}; commands that read write
// their object, or {"error": error} when they fail. The keys are documented
// in docs/cli-json.md. The commands the remote API has too (ls, status,
// plan, snapshot ls, events, stats) print the API's result types, whose
// schema is remoteapi/openapi.json; the others' keys never come and go: a
// value that does not apply is "", 0, false, [] or null. TestCLIJSON
// checks every command against openapi.json or docs/cli-json.schema.json.

// actionJSON is what an acting command did to one VM (or file).
type actionJSON struct {
	Name   string     `json:"name"`   // the VM ("" for a file that did not parse)
	File   string     `json:"file"`   // the file it came from, "" if given by name
	Action string     `json:"action"` // what was done: started, unchanged, acpi, rebooted, ...
	State  string     `json:"state"`  // the VM's state afterwards, "" if not known
	Note   string     `json:"note"`
	Error  *errorJSON `json:"error"`
}

// errorJSON is an error as --json prints it.
type errorJSON struct {
	Message  string `json:"message"`
	Kind     string `json:"kind"` // usage, not-found, busy, not-running, interrupted, failed
	ExitCode int    `json:"exit_code"`
}

func toErrorJSON(err error) *errorJSON {
	if err == nil {
		return nil
	}
	code := exitCode(err)
	kind := map[int]string{exitUsage: "usage", exitNotFound: "not-found", exitBusy: "busy", exitNotRunning: "not-running",
		exitInterrupted: "interrupted"}[code]
	var re *remoteapi.Error
	switch {
	case kind == "" && errors.As(err, &re):
		kind = re.Kind // --remote: forbidden, unauthorized, too-many, too-large too
	case kind == "":
		kind = "failed"
	}
	var ee exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	return &errorJSON{Message: err.Error(), Kind: kind, ExitCode: code}
}

// stateJSON writes a state as status --json does ("shut off" -> "shut-off").
func stateJSON(s supervisor.State) string {
	b, _ := s.MarshalText()
	return string(b)
}

// nonNil is s, or an empty slice for nil (--json prints [], not null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// output is where a command's results go: text lines, or one JSON document.
type output struct {
	json    bool
	w       io.Writer
	acting  bool // the command reports actions: a results document
	results []actionJSON
	wrote   bool // a JSON document (or line) was written
}

// action reports what was done to one VM: line in text, an entry in JSON.
func (o *output) action(a actionJSON, line string) {
	o.acting = true
	if o.json {
		o.results = append(o.results, a)
		return
	}
	if line != "" {
		fmt.Fprintln(o.w, line)
	}
}

// object writes v in JSON, or runs text.
func (o *output) object(v any, text func(w io.Writer)) error {
	if !o.json {
		text(o.w)
		return nil
	}
	o.wrote = true
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// line writes one JSON line (logs, migrate progress).
func (o *output) line(v any) {
	o.wrote = true
	json.NewEncoder(o.w).Encode(v)
}

// finish writes the JSON document of an acting command, or the error of one
// that wrote nothing; it reports whether the error is said.
func (o *output) finish(err error) bool {
	if !o.json {
		return false
	}
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	switch {
	case o.acting:
		results := o.results
		if results == nil {
			results = []actionJSON{}
		}
		enc.Encode(struct {
			Results []actionJSON `json:"results"`
			Error   *errorJSON   `json:"error"`
		}{results, toErrorJSON(err)})
		return true
	case err != nil && !o.wrote:
		enc.Encode(struct {
			Error *errorJSON `json:"error"`
		}{toErrorJSON(err)})
		return true
	}
	return err == nil
}
