package vmstore

import (
	"bytes"
	"os"
	"strconv"
)

// QEMUPID is the QEMU of VM name listening on qmpPath, as this process
// sees it (0: none): a migration's two QEMUs of one VM differ by socket.
func QEMUPID(name, qmpPath string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && QEMUName(b) == name && bytes.Contains(b, []byte(qmpPath)) {
			return pid
		}
	}
	return 0
}

// QEMUName is the VM name in a QEMU's command line (cmdline: -name
// guest=NAME,...), "" if none.
func QEMUName(cmdline []byte) string {
	_, after, ok := bytes.Cut(cmdline, []byte("\x00-name\x00guest="))
	if !ok {
		return ""
	}
	name, _, _ := bytes.Cut(after, []byte(","))
	return string(name)
}
