package qmppolicy

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := "/var/lib/vmsup/vms/web"
	for _, c := range []struct {
		cmd, want string // want "" = passes
	}{
		{`{"execute":"query-status"}`, ""},
		{`{"execute":"human-monitor-command","arguments":{"command-line":"info network"}}`, ""},
		{`{"execute":"human-monitor-command","arguments":{"command-line":"gdbserver tcp::1234"}}`, `only "info ..." passes`},
		{`{"execute":"human-monitor-command","arguments":{"command-line":"hostfwd_add tcp::2222-:22"}}`, `only "info ..." passes`},
		{`{"execute":"migrate","arguments":{"uri":"exec:cat > /tmp/x"}}`, "runs a program"},
		{`{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:4444"}}`, ""},
		{`{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"file","data":{"out":"/etc/cron.d/x"}}}}`, "/etc/cron.d/x, a host path outside"},
		{`{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"file","data":{"out":"/var/lib/vmsup/vms/web/c.log"}}}}`, ""},
		{`{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"socket","data":{"addr":{"type":"inet","data":{"host":"0.0.0.0","port":"99"}},"server":true}}}}`, "network socket"},
		{`{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"ringbuf","data":{}}}}`, ""},
		{`{"execute":"object-add","arguments":{"qom-type":"memory-backend-file","id":"m","mem-path":"/dev/shm/x","size":1048576}}`, "/dev/shm/x"},
		{`{"execute":"object-add","arguments":{"qom-type":"memory-backend-file","id":"m","mem-path":"/var/lib/vmsup/vms/web/../other/m","size":1}}`, "outside"},
		{`{"execute":"dump-guest-memory","arguments":{"paging":false,"protocol":"file:/root/dump"}}`, "/root/dump"},
		{`{"execute":"quit"}`, "use vmsup down"},
		{`{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}`, ""},
		{`{"execute":"qom-get","arguments":{"path":"/objects/mem-dimm0","property":"size"}}`, ""},
		{`{"execute":"device_del","arguments":{"id":"/machine/peripheral/disk-a"}}`, ""},
		{`{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"serial","data":{"device":"/dev/ttyS0"}}}}`, "/dev/ttyS0"},
		{`not json`, "not a QMP command"},
	} {
		err := Check([]byte(c.cmd), dir)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.cmd, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want %q", c.cmd, err, c.want)
		}
	}
}
