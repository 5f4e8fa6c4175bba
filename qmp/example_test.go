package qmp_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/vmsup/vmsup/qmp"
)

func ExampleDial() {
	ctx := context.Background()
	c, err := qmp.Dial(ctx, "/var/lib/vmsup/vms/web/qmp.sock" /* Supervisor.Sockets("web").QMP */, qmp.WithCommandTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Subscribe before the command whose event you wait for.
	events, unsubscribe := c.Subscribe(ctx)
	defer unsubscribe()
	if err := c.DeviceDel(ctx, "disk1"); qmp.IsClass(err, qmp.ClassDeviceNotFound) {
		return // already gone
	} else if err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := qmp.WaitEvent(wctx, events, "DEVICE_DELETED", func(ev goqmp.Event) bool {
		return ev.Data["device"] == "disk1"
	}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("unplugged")
}
