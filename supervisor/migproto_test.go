package supervisor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// TestReceiveProtocolEdges: the receiver refuses a protocol version it does
// not speak, and a source that goes away before prepare leaves nothing.
// Pure protocol: no systemd or QEMU is reached.
func TestReceiveProtocolEdges(t *testing.T) {
	root := t.TempDir()
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: "unix:path=/nonexistent", Self: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, send, wantReply, wantErr string
	}{
		{"newer version", `{"type":"hello","version":99}` + "\n", `"type":"error"`, "protocol version 99 not supported"},
		{"not hello", `{"type":"prepare","version":2}` + "\n", `speaks migration protocol version 2`, "not supported"},
		{"older version (plaintext stream)", `{"type":"hello","version":1}` + "\n", `"type":"error"`, "protocol version 1 not supported"},
		{"eof after hello", `{"type":"hello","version":2}` + "\n", `"type":"hello"`, "aborted"},
		{"garbage", "not json\n", "", "hello"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			outR, outW := io.Pipe()
			replies := make(chan string, 4)
			go func() {
				sc := bufio.NewScanner(outR)
				for sc.Scan() {
					replies <- sc.Text()
				}
				close(replies)
			}()
			err := sup.Receive(ctx, strings.NewReader(c.send), outW)
			outW.Close()
			var got []string
			for r := range replies {
				var m map[string]any
				if json.Unmarshal([]byte(r), &m) != nil {
					t.Fatalf("reply is not JSON: %q", r)
				}
				got = append(got, r)
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err %v, want %q", err, c.wantErr)
			}
			if c.wantReply != "" && !strings.Contains(strings.Join(got, "\n"), c.wantReply) {
				t.Fatalf("replies %q, want %q", got, c.wantReply)
			}
			if ents, _ := os.ReadDir(filepath.Join(root, "vms")); len(ents) != 0 {
				t.Fatalf("receiver left %v", ents)
			}
		})
	}
}
