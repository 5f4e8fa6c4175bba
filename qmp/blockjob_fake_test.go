package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// Argument marshalling of the block job, bitmap, transaction and NBD
// commands, and WaitJob's reading of job states, against a fake QEMU.

// scriptedQEMU answers each command with answer's events (written first)
// and return value, and records the commands.
type scriptedQEMU struct {
	mu   sync.Mutex
	cmds []fakeCmd
}

func (s *scriptedQEMU) serve(t *testing.T, answer func(cmd fakeCmd) (events []string, ret string)) *Conn {
	t.Helper()
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		for {
			cmd, err := readCmd(dec)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cmds = append(s.cmds, cmd)
			s.mu.Unlock()
			evs, ret := answer(cmd)
			var b strings.Builder
			for _, ev := range evs {
				fmt.Fprintf(&b, `{"event": %q, "data": %s, "timestamp": {"seconds": 1, "microseconds": 0}}`+"\r\n", strings.Fields(ev)[0], strings.TrimPrefix(ev, strings.Fields(ev)[0]+" "))
			}
			if ret == "" {
				ret = "{}"
			}
			fmt.Fprintf(&b, `{"return": %s, "id": %s}`+"\r\n", ret, cmd.ID)
			if _, err := io.WriteString(c, b.String()); err != nil {
				return
			}
		}
	})
	return dialFake(t, sock, WithCommandTimeout(5*time.Second))
}

func (s *scriptedQEMU) last() fakeCmd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmds[len(s.cmds)-1]
}

// sameJSON compares two JSON texts as values.
func sameJSON(t *testing.T, got json.RawMessage, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil && len(got) > 0 {
		t.Fatalf("bad JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad wanted JSON %s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

func TestFakeBlockCommandArgs(t *testing.T) {
	t.Parallel()
	var s scriptedQEMU
	c := s.serve(t, func(fakeCmd) ([]string, string) { return nil, "" })
	ctx := context.Background()
	no := false
	tests := []struct {
		call    func() error
		command string
		args    string
	}{
		{func() error { return c.BlockdevSnapshot(ctx, "base", "ov") }, "blockdev-snapshot", `{"node":"base","overlay":"ov"}`},
		{func() error { return c.Transaction(ctx, nil, false) }, "transaction", `{"actions":[]}`},
		{func() error {
			return c.Transaction(ctx, []TransactionAction{
				SnapshotAction("base", "ov"),
				BitmapAddAction(BitmapAdd{Node: "ov", Name: "b0", Persistent: true}),
				BitmapClearAction("n", "b1"),
				BitmapRemoveAction("n", "b2"),
				BitmapDisableAction("n", "b3"),
				BackupAction(Backup{JobID: "j", Device: "d", Target: "t", Sync: "bitmap", Bitmap: "b0", BitmapMode: "on-success"}),
			}, true)
		}, "transaction", `{"actions":[
			{"type":"blockdev-snapshot","data":{"node":"base","overlay":"ov"}},
			{"type":"block-dirty-bitmap-add","data":{"node":"ov","name":"b0","persistent":true,"disabled":false}},
			{"type":"block-dirty-bitmap-clear","data":{"node":"n","name":"b1"}},
			{"type":"block-dirty-bitmap-remove","data":{"node":"n","name":"b2"}},
			{"type":"block-dirty-bitmap-disable","data":{"node":"n","name":"b3"}},
			{"type":"blockdev-backup","data":{"job-id":"j","device":"d","target":"t","sync":"bitmap","bitmap":"b0","bitmap-mode":"on-success"}}],
			"properties":{"completion-mode":"grouped"}}`},
		{func() error {
			return c.BlockDirtyBitmapAdd(ctx, BitmapAdd{Node: "n", Name: "b", Disabled: true, Granularity: 1 << 16})
		}, "block-dirty-bitmap-add", `{"node":"n","name":"b","persistent":false,"disabled":true,"granularity":65536}`},
		{func() error { return c.BlockDirtyBitmapRemove(ctx, "n", "b") }, "block-dirty-bitmap-remove", `{"node":"n","name":"b"}`},
		{func() error { return c.BlockDirtyBitmapClear(ctx, "n", "b") }, "block-dirty-bitmap-clear", `{"node":"n","name":"b"}`},
		{func() error { return c.BlockDirtyBitmapEnable(ctx, "n", "b") }, "block-dirty-bitmap-enable", `{"node":"n","name":"b"}`},
		{func() error {
			return c.BlockdevBackup(ctx, Backup{Device: "d", Target: "t", Sync: "full", Speed: 1 << 20, AutoFinalize: &no, AutoDismiss: &no})
		}, "blockdev-backup", `{"device":"d","target":"t","sync":"full","speed":1048576,"auto-finalize":false,"auto-dismiss":false}`},
		{func() error {
			return c.BlockCommit(ctx, Commit{JobID: "c", Device: "d", TopNode: "top", BaseNode: "base"})
		},
			"block-commit", `{"job-id":"c","device":"d","top-node":"top","base-node":"base"}`},
		{func() error { return c.BlockStream(ctx, Stream{JobID: "s", Device: "d", AutoDismiss: &no}) },
			"block-stream", `{"job-id":"s","device":"d","auto-dismiss":false}`},
		{func() error {
			return c.BlockdevMirror(ctx, Mirror{JobID: "m", Device: "d", Target: "t", Sync: "full", CopyMode: "write-blocking"})
		}, "blockdev-mirror", `{"job-id":"m","device":"d","target":"t","sync":"full","copy-mode":"write-blocking"}`},
		{func() error { return c.JobComplete(ctx, "j") }, "job-complete", `{"id":"j"}`},
		{func() error { return c.JobCancel(ctx, "j") }, "job-cancel", `{"id":"j"}`},
		{func() error { return c.JobFinalize(ctx, "j") }, "job-finalize", `{"id":"j"}`},
		{func() error { return c.JobDismiss(ctx, "j") }, "job-dismiss", `{"id":"j"}`},
		{func() error { return c.BlockJobCancel(ctx, "j", false) }, "block-job-cancel", `{"device":"j"}`},
		{func() error { return c.BlockJobCancel(ctx, "j", true) }, "block-job-cancel", `{"device":"j","force":true}`},
		{func() error { return c.NBDServerStart(ctx, "/run/x.sock") }, "nbd-server-start",
			`{"addr":{"type":"unix","data":{"path":"/run/x.sock"}}}`},
		{func() error { return c.NBDServerStop(ctx) }, "nbd-server-stop", ``},
		{func() error {
			return c.BlockExportAdd(ctx, BlockExport{ID: "e", NodeName: "n", Name: "disk", Bitmaps: []string{"b0"}})
		}, "block-export-add", `{"type":"nbd","id":"e","node-name":"n","name":"disk","bitmaps":["b0"]}`},
		{func() error { return c.BlockExportDel(ctx, "e", false) }, "block-export-del", `{"id":"e","mode":"safe"}`},
		{func() error { return c.BlockExportDel(ctx, "e", true) }, "block-export-del", `{"id":"e","mode":"hard"}`},
	}
	for i, tt := range tests {
		if err := tt.call(); err != nil {
			t.Errorf("#%d %s: %v", i, tt.command, err)
			continue
		}
		got := s.last()
		if got.Execute != tt.command {
			t.Errorf("#%d sent %s, want %s", i, got.Execute, tt.command)
		}
		if tt.args == "" {
			if len(got.Arguments) != 0 {
				t.Errorf("#%d %s: arguments %s, want none", i, tt.command, got.Arguments)
			}
		} else if !sameJSON(t, got.Arguments, tt.args) {
			t.Errorf("#%d %s: arguments %s\nwant %s", i, tt.command, got.Arguments, tt.args)
		}
	}
}

func TestFakeBlockReplies(t *testing.T) {
	t.Parallel()
	var s scriptedQEMU
	c := s.serve(t, func(cmd fakeCmd) ([]string, string) {
		switch cmd.Execute {
		case "query-jobs":
			return nil, `[{"current-progress": 5, "status": "concluded", "total-progress": 10, "type": "backup", "id": "j", "error": "No space left on device"}]`
		case "query-block-exports":
			return nil, `[{"node-name": "n", "shutting-down": true, "type": "nbd", "id": "e"}]`
		case "query-named-block-nodes":
			return nil, `[{"node-name": "n", "drv": "qcow2", "dirty-bitmaps": [{"name": "b0", "recording": true, "persistent": true, "busy": false, "granularity": 65536, "count": 131072}]}]`
		}
		return nil, ""
	})
	ctx := context.Background()
	jobs, err := c.QueryJobs(ctx)
	want := []Job{{ID: "j", Type: "backup", Status: "concluded", Error: "No space left on device", CurrentProgress: 5, TotalProgress: 10}}
	if err != nil || !reflect.DeepEqual(jobs, want) {
		t.Errorf("QueryJobs = %+v, %v", jobs, err)
	}
	es, err := c.QueryBlockExports(ctx)
	if err != nil || !reflect.DeepEqual(es, []ExportInfo{{ID: "e", Type: "nbd", NodeName: "n", ShuttingDown: true}}) {
		t.Errorf("QueryBlockExports = %+v, %v", es, err)
	}
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil || len(nodes) != 1 || !reflect.DeepEqual(nodes[0].DirtyBitmaps,
		[]DirtyBitmap{{Name: "b0", Count: 131072, Granularity: 65536, Recording: true, Persistent: true}}) {
		t.Errorf("QueryNamedBlockNodes = %+v, %v", nodes, err)
	}
}

// WaitJob's verdicts on scripted query-jobs replies and events.
func TestFakeWaitJob(t *testing.T) {
	t.Parallel()
	job := func(status, errText string) string {
		return fmt.Sprintf(`[{"id": "j", "type": "mirror", "status": %q, "error": %q, "current-progress": 1, "total-progress": 2}]`, status, errText)
	}
	ready := func(j Job) bool { return j.Status == "ready" }
	tests := []struct {
		name    string
		replies []string // query-jobs replies in turn; the last repeats
		events  []string // sent before the last reply
		done    func(Job) bool
		want    JobStatus // status of the returned job
		wantErr string    // "" for success; else a substring
	}{
		{"ready", []string{job("created", ""), job("running", ""), job("ready", "")}, nil, ready, "ready", ""},
		{"concluded", []string{job("running", ""), job("concluded", "")}, nil, nil, "concluded", ""},
		{"failed", []string{job("running", ""), job("concluded", "Input/output error")}, nil, ready, "concluded", "Input/output error"},
		{"concluded before ready", []string{job("concluded", "")}, nil, ready, "concluded", "before reaching"},
		{"gone after completion event", []string{job("running", ""), `[]`},
			[]string{`BLOCK_JOB_COMPLETED {"device": "j", "type": "mirror", "len": 2, "offset": 2, "speed": 0}`}, nil, "null", ""},
		{"gone after failure event", []string{job("running", ""), `[]`},
			[]string{`BLOCK_JOB_COMPLETED {"device": "j", "type": "mirror", "len": 2, "offset": 1, "speed": 0, "error": "No space left on device"}`}, nil, "null", "No space left"},
		{"gone after cancel event", []string{job("running", ""), `[]`},
			[]string{`BLOCK_JOB_CANCELLED {"device": "j", "type": "mirror", "len": 2, "offset": 1, "speed": 0}`}, nil, "null", "cancelled"},
		{"gone without a word", []string{`[]`}, nil, nil, "", "no longer listed"},
		{"still running", []string{job("running", "")}, nil, nil, "running", "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var s scriptedQEMU
			var n int
			var nmu sync.Mutex
			c := s.serve(t, func(cmd fakeCmd) ([]string, string) {
				nmu.Lock()
				defer nmu.Unlock()
				i := min(n, len(tt.replies)-1)
				n++
				if i == len(tt.replies)-1 {
					return tt.events, tt.replies[i]
				}
				return nil, tt.replies[i]
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			polls := 0
			j, err := WaitJob(ctx, c, "j", tt.done, func(Job) { polls++ })
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("WaitJob = %+v, %v; want error %q", j, err, tt.wantErr)
			}
			var je *JobError
			if tt.wantErr != "" && tt.wantErr != "deadline exceeded" && (!errors.As(err, &je) || !strings.Contains(err.Error(), "job j")) {
				t.Errorf("error %v is not a *JobError naming the job", err)
			}
			if j.Status != tt.want || polls == 0 && tt.want != "" {
				t.Errorf("WaitJob returned %+v after %d progress calls; want status %q", j, polls, tt.want)
			}
		})
	}
}
