// Command sandbox runs a private systemd (internal/dev/testenv) for the demo on
// machines whose PID 1 is not systemd. It writes the environment vmsup needs
// to reach it into -env and runs until SIGTERM/SIGINT, then stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

func main() {
	dir := flag.String("dir", "", "directory for the sandbox's files")
	envFile := flag.String("env", "", "write VMSUP_SYSTEMD_BUS/VMSUP_JOURNAL_DIR here once ready")
	flag.Parse()
	if *dir == "" || *envFile == "" {
		fmt.Fprintln(os.Stderr, "usage: sandbox -dir DIR -env FILE")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	sd, err := testenv.StartSystemd(ctx, *dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	env := fmt.Sprintf("VMSUP_SYSTEMD_BUS=%s\nVMSUP_JOURNAL_DIR=%s\nSANDBOX_PID1=%d\n", sd.BusAddress, sd.JournalDir, sd.PID1)
	if err := os.WriteFile(*envFile, []byte(env), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		sd.Stop()
		os.Exit(1)
	}
	<-sig
	if err := sd.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: stop:", err)
		os.Exit(1)
	}
}
