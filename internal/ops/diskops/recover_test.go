package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// The recoverers' looks, against a stand-in QEMU and systemd: what they
// answer is set per case, and what was asked is logged.

// standIn is a stand-in QEMU (blockState, runStates) and systemd
// (unitStates).
type standIn struct {
	err    error // every QEMU query fails with it
	nodes  []qmp.BlockNode
	jobs   []qmp.Job
	open   map[string]string // image file -> the format node QEMU has on it
	chain  map[string]bool   // node -> in a device's chain
	device map[string]string // disk -> the node its device runs on
	save   qmp.MigrationStatus
	run    qmp.RunState
	runErr error // query-status fails with it
	unit   units.Status
	alive  map[string]bool // VM -> it runs (Running)
	asked  []string
}

var (
	_ blockState = (*standIn)(nil)
	_ runStates  = (*standIn)(nil)
	_ unitStates = (*standIn)(nil)
)

func (q *standIn) ask(what string) error { q.asked = append(q.asked, what); return q.err }

func (q *standIn) QueryJobs(context.Context) ([]qmp.Job, error) { return q.jobs, q.ask("query-jobs") }

func (q *standIn) QueryNamedBlockNodes(context.Context) ([]qmp.BlockNode, error) {
	return q.nodes, q.ask("query-named-block-nodes")
}

func (q *standIn) NodeOn(_ context.Context, path string) (qmp.BlockNode, error) {
	if err := q.ask("node-on " + path); err != nil {
		return qmp.BlockNode{}, err
	}
	if n, ok := q.open[path]; ok {
		return qmp.BlockNode{NodeName: n}, nil
	}
	return qmp.BlockNode{}, fmt.Errorf("QEMU has no node on %s", path)
}

func (q *standIn) RootOf(_ context.Context, node string) (string, string, error) {
	if err := q.ask("root-of " + node); err != nil {
		return "", "", err
	}
	if q.chain[node] {
		return "root", "", nil
	}
	return "", "", fmt.Errorf("node %s is in no device's chain", node)
}

func (q *standIn) DeviceNode(_ context.Context, disk string) (string, error) {
	if err := q.ask("device-node " + disk); err != nil {
		return "", err
	}
	if n, ok := q.device[disk]; ok {
		return n, nil
	}
	return "", errors.New("QEMU has no device " + disk)
}

func (q *standIn) QueryStatus(context.Context) (qmp.StatusInfo, error) {
	if err := errors.Join(q.ask("query-status"), q.runErr); err != nil {
		return qmp.StatusInfo{}, err
	}
	return qmp.StatusInfo{Status: q.run, Running: q.run == qmp.RunRunning}, nil
}

func (q *standIn) QueryMigrate(context.Context) (qmp.MigrationInfo, error) {
	return qmp.MigrationInfo{Status: q.save}, q.ask("query-migrate")
}

func (q *standIn) UnitStatus(context.Context, string) (units.Status, error) {
	q.asked = append(q.asked, "unit")
	return q.unit, nil
}

func (q *standIn) RunState(context.Context, string) qmp.RunState {
	q.asked = append(q.asked, "run-state")
	return q.run
}

func (q *standIn) Running(_ context.Context, name string) bool {
	q.asked = append(q.asked, "running "+name)
	return q.alive[name]
}

// journal is a journal's steps done, as Op.Has sees them.
func journal(done ...operation.Step) func(operation.Step) bool {
	return func(s operation.Step) bool {
		for _, d := range done {
			if d == s {
				return true
			}
		}
		return false
	}
}

// unitUp and unitGone are a VM's unit as systemd has it.
var (
	unitUp   = units.Status{Exists: true, ActiveState: "active", SubState: "running"}
	unitGone = units.Status{Exists: true, ActiveState: "failed", SubState: "failed"}
)

// toolStandIn puts a stand-in qemu-img first on PATH (the storage tools'
// default) that logs its calls: what the recoverers ask of the images.
// It returns them: each call's command and last argument (the image), one
// a line.
func toolStandIn(t *testing.T) (calls func() []string) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"$1 $(eval echo \\${$#})\" >> " + filepath.Join(dir, "calls") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "qemu-img"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() []string {
		b, err := os.ReadFile(filepath.Join(dir, "calls"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
}
