// Package failuretest tests what a VM does when something fails inside it or
// under it: a guest kernel panic (pvpanic, on_panic), QEMU killed
// (on_crash), the restart limit, a guest flooding its console (the bounded
// console log), with the stats that move meanwhile. It is a package of its
// own so that go test runs it beside the supervisor package's long suite
// (one package per slot on two cores), not after it.
package failuretest
