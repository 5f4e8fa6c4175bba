package stats

import (
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// inNewNetns runs f on a locked OS thread moved into a fresh network
// namespace, with a netlink handle on it, and moves the thread back after.
// The namespace and its links go when the last reference closes.
func inNewNetns(t *testing.T, f func(h *netlink.Handle)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("current netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New() // this thread is in it from here on
	if err != nil {
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			// Keep the thread locked: Go ends it with the goroutine
			// rather than reuse it in the wrong namespace.
			t.Errorf("restore netns: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	defer h.Close()
	f(h)
}

// TestTapCounters plays QEMU: it holds a tap's file descriptor, writes
// frames into it as the guest would send them and reads what the host sends
// the guest, and checks TapCounters reports both the guest's way round.
func TestTapCounters(t *testing.T) {
	inNewNetns(t, func(h *netlink.Handle) {
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: "vmst-tap0"},
			Mode:      netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI,
			Queues: 1, NonPersist: true, // goes with its descriptor
		}
		if err := h.LinkAdd(tap); err != nil { // opened on this thread: in the namespace
			t.Fatalf("add tap: %v", err)
		}
		guestFd := tap.Fds[0]
		defer guestFd.Close()
		addr, _ := netlink.ParseAddr("10.213.77.1/24")
		if err := h.AddrAdd(tap, addr); err != nil {
			t.Fatalf("address: %v", err)
		}
		if err := h.LinkSetUp(tap); err != nil {
			t.Fatalf("up: %v", err)
		}
		// The "guest" at 10.213.77.2, known without ARP.
		guestMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
		dst := net.ParseIP("10.213.77.2")
		if err := h.NeighAdd(&netlink.Neigh{
			LinkIndex: tap.Attrs().Index, State: netlink.NUD_PERMANENT, IP: dst, HardwareAddr: guestMAC,
		}); err != nil {
			t.Fatalf("neighbour: %v", err)
		}

		before, err := TapCounters(h, "vmst-tap0")
		if err != nil {
			t.Fatal(err)
		}

		// Guest to host: broadcast frames of an unused ethertype, which the
		// host counts and drops.
		const sent, frameLen = 5, 300
		frame := make([]byte, frameLen)
		copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(frame[6:], guestMAC)
		frame[12], frame[13] = 0x88, 0xb5 // IEEE local experimental
		for range sent {
			if _, err := guestFd.Write(frame); err != nil {
				t.Fatalf("write to tap: %v", err)
			}
		}
		// Host to guest: UDP from a socket opened here, so in the namespace.
		conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: dst, Port: 9})
		if err != nil {
			t.Fatalf("udp socket: %v", err)
		}
		defer conn.Close()
		const received, size = 20, 1000
		payload := make([]byte, size)
		for range received {
			if _, err := conn.Write(payload); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
		// The guest reads them, as QEMU would (the IPv6 chatter too).
		if err := guestFd.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		buf, udp := make([]byte, 65536), 0
		for {
			n, err := guestFd.Read(buf)
			if err != nil {
				break
			}
			if n > 12 && buf[12] == 0x08 && buf[13] == 0x00 {
				udp++
			}
		}
		if udp != received {
			t.Errorf("guest read %d IPv4 frames, want %d", udp, received)
		}

		// nil handle: the thread's current namespace, this one.
		after, err := TapCounters(nil, "vmst-tap0")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("guest view: %+v -> %+v", before, after)
		if d := after.TxPackets - before.TxPackets; d != sent {
			t.Errorf("TxPackets grew %d, want %d (the frames the guest wrote)", d, sent)
		}
		if d := after.TxBytes - before.TxBytes; d != sent*frameLen {
			t.Errorf("TxBytes grew %d, want %d", d, sent*frameLen)
		}
		if d := after.RxPackets - before.RxPackets; d < received {
			t.Errorf("RxPackets grew %d, want >= %d (the UDP sent to the guest)", d, received)
		}
		if d := after.RxBytes - before.RxBytes; d < received*size {
			t.Errorf("RxBytes grew %d, want >= %d", d, received*size)
		}
		if after.HostIf != "vmst-tap0" || after.Name != "" {
			t.Errorf("HostIf %q Name %q, want vmst-tap0 and empty", after.HostIf, after.Name)
		}

		// The kernel's own counters, the other way round.
		link, err := h.LinkByName("vmst-tap0")
		if err != nil {
			t.Fatal(err)
		}
		// Nothing moves now, but for IPv6 chatter host to guest.
		if st := link.Attrs().Statistics; st.RxPackets != after.TxPackets || st.RxBytes != after.TxBytes ||
			st.RxDropped != after.TxDropped || st.TxBytes < after.RxBytes {
			t.Errorf("kernel %+v vs guest view %+v", *st, after)
		}

		if _, err := TapCounters(h, "vmst-nosuch"); err == nil || !strings.Contains(err.Error(), "vmst-nosuch") {
			t.Errorf("missing link: err = %v, want one naming it", err)
		}
	})
	// Back in the original namespace, which never had the tap.
	if _, err := netlink.LinkByName("vmst-tap0"); err == nil {
		t.Error("vmst-tap0 visible outside the test namespace")
	}
}
