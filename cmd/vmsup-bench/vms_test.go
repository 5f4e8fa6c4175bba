package main

import "testing"

func TestConsoleLogFile(t *testing.T) {
	argv := []string{"qemu", "-chardev", "socket,id=qmp,path=/r/q.sock,server=on,wait=off",
		"-chardev", "socket,id=console,path=/r/c.sock,server=on,wait=off,logfile=/r/a,,b/console.fifo"}
	got, err := consoleLogFile(argv)
	if err != nil || got != "/r/a,b/console.fifo" {
		t.Fatalf("consoleLogFile = %q, %v; want /r/a,b/console.fifo", got, err)
	}
	if _, err := consoleLogFile(argv[:3]); err == nil {
		t.Fatal("an argv without a console logfile gave no error")
	}
}
