package migwire

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ReceiverExit bounds the wait for the receiver to end once the source
// closes its side.
const ReceiverExit = 30 * time.Second

// InProcess runs serve as the receiver in this process (a migration on one
// host), over pipes. stop ends its input and waits (bounded) for it.
func InProcess(serve func(*Peer)) (peer *Peer, stop func()) {
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(NewPeer(reqR, repW))
		repW.Close()
		reqR.Close()
	}()
	return NewPeer(repR, reqW), func() {
		reqW.Close()
		select {
		case <-done:
		case <-time.After(ReceiverExit):
		}
	}
}

// Command runs the receiver through a transport command (ssh ... vmsup
// migrate-receive) and speaks the protocol over its stdin and stdout; its
// stderr goes to stderr. stop ends its input and waits (bounded, then
// kills it).
func Command(argv []string, stderr io.Writer) (peer *Peer, stop func(), err error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	// Own process group: a Ctrl-C on the terminal reaches vmsup, which
	// cancels in order, not the transport.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	// An os.Pipe rather than StdoutPipe: Wait closes StdoutPipe's read end
	// as soon as the receiver exits, which can be before its last reply
	// ("finalized") has been read.
	stdout, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		stdout.Close()
		return nil, nil, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	return NewPeer(stdout, stdin), func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(ReceiverExit):
			_ = cmd.Process.Kill()
			<-exited
		}
		stdout.Close()
	}, nil
}
