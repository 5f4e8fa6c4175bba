// Package snapshottest checks snapshots on a real guest writing known
// patterns to a real disk: a disk-only snapshot, writes, a revert; a memory
// snapshot whose revert resumes the guest where it was; live removal. It is
// a package of its own so that its guest boots beside the supervisor
// package's tests, not after them.
package snapshottest
