// Package faultsnaptest holds the fault suite of the disk operations that
// rewrite which images a VM runs on (snapshots, their removal, reverts,
// clones), each killed after every step and at random times
// (supervisortest.RunFaults). A package of its own so that go test runs it
// beside the other fault suite (supervisor/faulttest) on two cores. It has
// no non-test code.
package faultsnaptest
