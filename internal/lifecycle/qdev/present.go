package qdev

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// Present is what of a device's parts QEMU has now: its devices (by id),
// block nodes, objects and fd sets (by opaque note). Recovery after a
// command died mid-hotplug decides from it, not from records.
type Present struct {
	Devices, Nodes, Objects map[string]bool
	FDSets                  map[string]int64 // opaque -> fd set id
}

// Query asks QEMU for what exists now.
func Query(ctx context.Context, c *qmp.Conn) (Present, error) {
	p := Present{Devices: map[string]bool{}, Nodes: map[string]bool{}, Objects: map[string]bool{}, FDSets: map[string]int64{}}
	devs, err := c.QOMList(ctx, "/machine/peripheral")
	if err != nil {
		return p, fmt.Errorf("qom-list /machine/peripheral: %w", err)
	}
	for _, d := range devs {
		if strings.HasPrefix(d.Type, "child<") {
			p.Devices[d.Name] = true
		}
	}
	objs, err := c.QOMList(ctx, "/objects")
	if err != nil {
		return p, fmt.Errorf("qom-list /objects: %w", err)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Type, "child<") {
			p.Objects[o.Name] = true
		}
	}
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil {
		return p, fmt.Errorf("query-named-block-nodes: %w", err)
	}
	for _, n := range nodes {
		p.Nodes[n.NodeName] = true
	}
	sets, err := c.QueryFDSets(ctx)
	if err != nil {
		return p, fmt.Errorf("query-fdsets: %w", err)
	}
	for _, s := range sets {
		for _, f := range s.FDs {
			if f.Opaque != "" {
				p.FDSets[f.Opaque] = s.FDSetID
			}
		}
	}
	return p, nil
}

// FinishUnplug completes a hot-unplug that a killed command may have begun:
// device_del again (the guest may never have been asked; one already asked
// may refuse a second request, which is fine), then it waits until QEMU no
// longer has the device. gone is false when the guest still holds it after
// timeout.
func FinishUnplug(ctx context.Context, c *qmp.Conn, id string, timeout time.Duration) (gone bool, err error) {
	_ = c.DeviceDel(ctx, id)
	deadline := time.Now().Add(timeout)
	for {
		devs, err := c.QOMList(ctx, "/machine/peripheral")
		if err != nil {
			return false, fmt.Errorf("qom-list /machine/peripheral: %w", err)
		}
		if !slices.ContainsFunc(devs, func(d qmp.QOMProperty) bool { return d.Name == id }) {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
