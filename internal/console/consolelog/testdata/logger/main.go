// Command logger runs consolelog.Run on a FIFO, as vmsup's logger process
// does: TestRSS measures its memory.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: logger FIFO LOG MAXBYTES KEEP")
		os.Exit(2)
	}
	maxBytes, _ := strconv.ParseInt(os.Args[3], 10, 64)
	keep, _ := strconv.Atoi(os.Args[4])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	c := consolelog.Config{Path: os.Args[2], MaxBytes: maxBytes, Keep: keep}
	if err := consolelog.Run(ctx, os.Args[1], c, time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "logger:", err)
		os.Exit(1)
	}
}
