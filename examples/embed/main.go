// Command embed is a program that embeds vmsup as a library, the way an
// operator's own tool would: it builds a spec in Go, brings the VM up,
// waits for it to run, reads its typed events, pauses, resumes and takes
// it down. Its own binary is the units' stop hook, through the documented
// contract: main calls supervisor.HandleHook first.
//
//	embed -root /var/lib/vmsup -kernel vmlinux -initrd initrd.img [-leave-running]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func main() {
	// The units call this binary back (stop hook, network clean-up, the
	// guardian of an interrupted command): that comes first.
	if code, ok := supervisor.HandleHook(os.Args[1:]); ok {
		os.Exit(code)
	}
	root := flag.String("root", "/var/lib/vmsup", "vmsup state root")
	bus := flag.String("systemd-bus", "", "D-Bus address of the systemd that runs the units (empty: the system bus)")
	kernel := flag.String("kernel", "", "guest kernel")
	initrd := flag.String("initrd", "", "guest initrd")
	name := flag.String("name", "embedded", "VM name")
	leave := flag.Bool("leave-running", false, "bring the VM up and leave it running")
	flag.Parse()
	if err := run(*root, *bus, *name, *kernel, *initrd, *leave); err != nil {
		log.Fatal(err)
	}
}

func run(root, bus, name, kernel, initrd string, leave bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: bus, Self: self})
	if err != nil {
		return err
	}
	defer sup.Close()

	f, err := spec.New(name, spec.VM{
		Name: name, Memory: 256 * spec.MiB, Accel: spec.AccelTCG, StopTimeout: spec.Duration(30 * time.Second),
		Boot: spec.Boot{Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0"},
	})
	if err != nil {
		return err
	}
	if _, err := sup.Up(ctx, f); err != nil {
		return err
	}
	vm := sup.VM(name)
	st, err := vm.WaitState(ctx, supervisor.StateRunning)
	if err != nil {
		return err
	}
	fmt.Printf("up: %s, pid %d, console log %s\n", st.State, st.MainPID, vm.Sockets().ConsoleLog)
	// QEMU runs; the guest's OS is ready once its agent answers.
	for {
		if a, err := vm.GuestPing(ctx); err == nil && a.Responding {
			fmt.Printf("guest: %s\n", a.OS)
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the guest agent never answered: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if leave {
		return nil
	}

	// A typed QMP session, taking turns with vmsup's own commands.
	mon, release, err := vm.Monitor(ctx)
	if err != nil {
		return err
	}
	qs, err := mon.QueryStatus(ctx)
	release()
	if err != nil {
		return err
	}
	fmt.Printf("qmp: %s\n", qs.Status)

	events, err := vm.Events(ctx)
	if err != nil {
		return err
	}
	if err := vm.Pause(ctx); err != nil {
		return err
	}
	if err := expect(ctx, events, "STOP"); err != nil {
		return err
	}
	if err := vm.Resume(ctx); err != nil {
		return err
	}
	if err := expect(ctx, events, "RESUME"); err != nil {
		return err
	}
	r, err := vm.Down(ctx, supervisor.DownOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("down: %s\n", r.Step)
	return nil
}

// expect waits for the next event of kind and prints it.
func expect(ctx context.Context, events <-chan supervisor.Event, kind string) error {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("events ended before %s", kind)
			}
			if ev.Kind == kind {
				fmt.Printf("event: %s\n", ev.Kind)
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("no %s event: %w", kind, ctx.Err())
		}
	}
}
