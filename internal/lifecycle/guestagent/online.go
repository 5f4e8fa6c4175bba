package guestagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Onlining what a resize hot-plugged: QEMU plugs a vCPU or a DIMM, the
// guest's kernel sees it (an ACPI event) and leaves it offline unless a
// rule of the guest onlines it; Debian has none. Where the guest's agent
// answers, vmsup onlines them through it (guest-set-vcpus,
// guest-set-memory-blocks); elsewhere it says what the guest must do.

// Bounds of the onlining: how long the guest may take to see what was
// plugged, and how often vmsup looks.
const (
	OnlineWait = 30 * time.Second
	onlinePoll = 200 * time.Millisecond
)

// Session opens the VM's guest agent, one client at a time (release when
// done).
type Session func(ctx context.Context) (*qmp.Agent, func(), error)

// Onlined is what the guest agent brought online after a hot-plug.
type Onlined struct {
	CPUs   int       // vCPUs the agent onlined
	Memory spec.Size // memory the agent onlined (whole blocks)
	// Note says what was onlined, and what stays offline and what the
	// guest must do about it; "" when the guest had onlined all itself.
	Note string
}

// guestMust is what a guest must do with what the agent did not online.
const guestMust = "the guest must online them itself (a udev rule, or write 1 to /sys/devices/system/cpu/cpuN/online" +
	" and online_movable to /sys/devices/system/memory/memoryN/state)"

// Online brings online in the guest the cpus vCPUs QEMU runs and the
// memory of its DIMMs, through its agent: it waits (up to OnlineWait) for
// the guest to see them, then onlines those offline. c is the VM's
// monitor: whether the guest opened the agent's channel, and where its
// DIMMs are. It never fails: a guest it cannot reach or that refuses is
// named in the note.
func Online(ctx context.Context, c *qmp.Conn, session Session, cpus int) Onlined {
	ctx, cancel := context.WithTimeout(ctx, OnlineWait)
	defer cancel()
	if !c.FrontendOpen(ctx, qemuargs.AgentChardevID) {
		return Onlined{Note: "no guest agent runs: " + guestMust}
	}
	dimms, err := c.QueryMemoryDevices(ctx)
	if err != nil {
		return Onlined{Note: fmt.Sprintf("the DIMMs: %v: %s", err, guestMust)}
	}
	a, release, err := session(ctx)
	if err != nil {
		return Onlined{Note: fmt.Sprintf("guest agent: %v: %s", err, guestMust)}
	}
	defer release()
	var o Onlined
	var left []string
	n, why := onlineCPUs(ctx, a, cpus)
	o.CPUs = n
	if why != "" {
		left = append(left, why)
	}
	m, why := onlineMemory(ctx, a, dimms)
	o.Memory = m
	if why != "" {
		left = append(left, why)
	}
	o.Note = o.note(left)
	return o
}

func (o Onlined) note(left []string) string {
	var did []string
	if o.CPUs > 0 {
		did = append(did, fmt.Sprintf("%d vCPU(s)", o.CPUs))
	}
	if o.Memory > 0 {
		did = append(did, o.Memory.String()+" of memory")
	}
	var parts []string
	if len(did) > 0 {
		parts = append(parts, "the guest agent onlined "+strings.Join(did, " and "))
	}
	if len(left) > 0 {
		parts = append(parts, strings.Join(left, "; ")+": "+guestMust)
	}
	return strings.Join(parts, "; ")
}

// onlineCPUs waits until the guest sees want vCPUs and onlines those it
// left offline; it returns how many it onlined and, if some stay offline,
// why.
func onlineCPUs(ctx context.Context, a *qmp.Agent, want int) (int, string) {
	for {
		vs, err := a.GetVCPUs(ctx)
		if err != nil {
			return 0, fmt.Sprintf("guest agent: %v", err)
		}
		if len(vs) >= want {
			var off []qmp.GuestVCPU
			for _, v := range vs {
				if !v.Online {
					off = append(off, qmp.GuestVCPU{LogicalID: v.LogicalID, Online: true})
				}
			}
			if len(off) == 0 {
				return 0, ""
			}
			n, err := a.SetVCPUs(ctx, off)
			if err == nil && n < len(off) {
				err = fmt.Errorf("it onlined %d of %d", n, len(off))
			}
			if err != nil {
				return n, fmt.Sprintf("%d vCPU(s) offline (guest-set-vcpus: %v)", len(off)-n, err)
			}
			return n, ""
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Sprintf("the guest sees %d of %d vCPUs after %s", len(vs), want, OnlineWait)
		case <-time.After(onlinePoll):
		}
	}
}

// onlineMemory waits until the guest sees the memory blocks of dimms and
// onlines those it left offline; it returns how much it onlined and, if
// some stays offline, why.
func onlineMemory(ctx context.Context, a *qmp.Agent, dimms []qmp.MemoryDevice) (spec.Size, string) {
	if len(dimms) == 0 {
		return 0, ""
	}
	bs, err := a.MemoryBlockSize(ctx)
	if err != nil || bs == 0 {
		return 0, fmt.Sprintf("guest agent: memory block size: %v", err)
	}
	want := dimmBlocks(dimms, bs)
	for {
		blocks, err := a.MemoryBlocks(ctx)
		if err != nil {
			return 0, fmt.Sprintf("guest agent: %v", err)
		}
		off, missing := offlineBlocks(blocks, want)
		if missing == 0 {
			if len(off) == 0 {
				return 0, ""
			}
			rs, err := a.SetMemoryBlocks(ctx, off)
			if err != nil {
				return 0, fmt.Sprintf("%d memory block(s) offline (guest-set-memory-blocks: %v)", len(off), err)
			}
			var done int
			var failed []string
			for _, r := range rs {
				if r.Response == "success" {
					done++
				} else {
					failed = append(failed, fmt.Sprintf("block %d: %s (errno %d)", r.PhysIndex, r.Response, r.ErrorCode))
				}
			}
			got := spec.Size(uint64(done) * bs)
			if len(failed) > 0 {
				return got, fmt.Sprintf("%d memory block(s) offline (%s)", len(failed), strings.Join(failed, ", "))
			}
			return got, ""
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Sprintf("the guest does not see %d of the DIMMs' %d memory blocks after %s", missing, len(want), OnlineWait)
		case <-time.After(onlinePoll):
		}
	}
}

// dimmBlocks are the guest's memory block indices the DIMMs cover (bs: the
// guest's block size).
func dimmBlocks(dimms []qmp.MemoryDevice, bs uint64) []uint64 {
	var idx []uint64
	for _, d := range dimms {
		if d.Data.Size <= 0 || d.Data.Addr < 0 {
			continue
		}
		for i := uint64(d.Data.Addr) / bs; i < (uint64(d.Data.Addr)+uint64(d.Data.Size))/bs; i++ {
			idx = append(idx, i)
		}
	}
	return idx
}

// offlineBlocks are the blocks of want the guest has offline, as a
// request to online them, and how many of want it does not list yet.
func offlineBlocks(blocks []qmp.GuestMemoryBlock, want []uint64) (off []qmp.GuestMemoryBlock, missing int) {
	for _, i := range want {
		j := slices.IndexFunc(blocks, func(b qmp.GuestMemoryBlock) bool { return b.PhysIndex == i })
		switch {
		case j < 0:
			missing++
		case !blocks[j].Online:
			off = append(off, qmp.GuestMemoryBlock{PhysIndex: i, Online: true})
		}
	}
	return off, missing
}
