// Package testenv is the shared test environment of vmsup: one place that brings up
// the real components tests need and takes them down again.
//
// It owns these:
//
//   - a tiny bootable guest (GuestImage: an uncompressed Debian kernel and a busybox
//     initramfs with qemu-ga), built and cached by scripts/build-guest.sh;
//   - a private systemd 252 (Systemd) in its own PID, mount and UTS namespace, reachable
//     from the host over its D-Bus system bus, so tests can start transient units,
//     read their journal and inspect their cgroups even where PID 1 is not systemd;
//   - storage targets for disk tests: an iSCSI target (TGT: Debian's tgtd on
//     127.0.0.1 with a private control socket, file-backed LUNs, optional CHAP) and a
//     single-node Ceph cluster (Ceph: one monitor and one memstore OSD on loopback,
//     cephx, pool "rbd"), each started by StartTGT/StartCeph in a private directory
//     and stopped by pid. A package starts them once and shares them (see
//     supervisor's storage tests);
//   - QEMU 10 beside the installed 7.2 (scripts/install-qemu10.sh's prefix), put
//     in place in a running sandbox's, unit's or test's own mount namespace
//     (PutQEMU10) as a package upgrade would.
//
// A test package typically starts both once in TestMain:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		os.Exit(testenv.Main(m, func(e *testenv.Env) error { env = e; return nil }))
//	}
//
// and each test that needs them calls SkipUnlessRoot first. When the environment cannot
// be started, Main fails the whole package with the reason instead of skipping.
//
// It does not own QEMU command lines, QMP or unit definitions: those belong to the
// packages under test, and this package's own tests speak to QEMU with raw JSON.
//
// The guest's /init prints ReadyMarker on ttyS0 once modules, acpid and qemu-ga are
// set up and ShellMarker right before an interactive shell; see build-guest.sh for the
// kernel command-line words it understands (vmsup.counter, vmsup.ip=, vmsup.dhcp, ...).
package testenv
