package main

import "testing"

func TestLogsConsoleTo(t *testing.T) {
	argv := []string{"qemu", "-chardev", "socket,id=qmp,path=/r/q.sock,server=on,wait=off",
		"-chardev", "socket,id=console,path=/r/c.sock,server=on,wait=off,logfile=/r/a,,b/console.fifo"}
	if !logsConsoleTo(argv, "/r/a,b/console.fifo") {
		t.Fatalf("logsConsoleTo(%q, /r/a,b/console.fifo) = false", argv)
	}
	if logsConsoleTo(argv, "/r/a,b/console") {
		t.Fatal("a prefix of the console's logfile matched")
	}
	if logsConsoleTo(argv[:3], "/r/a,b/console.fifo") {
		t.Fatal("an argv without a console logfile matched")
	}
}
