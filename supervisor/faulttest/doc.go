// Package faulttest holds the fault suite: each multi-step command of a
// Supervisor (hot-plugs, set, restart, reboot, migrations local and across
// two hosts) killed with SIGKILL after each of its steps and at random
// times, and the VM checked to settle whole after each kill. It is a
// package of its own so that go test runs it beside the supervisor
// package's suite (one package per slot on two cores), not after it. It
// has no non-test code.
package faulttest
