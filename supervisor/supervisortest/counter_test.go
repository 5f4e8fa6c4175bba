package supervisortest

import (
	"slices"
	"testing"
)

// TestCounterValues: a counter line whose two copies of the value agree
// is that value; one that other console output cut into is Unreadable, a
// value that was printed but cannot be read, which CheckContinuous lets
// stand for exactly one value (a loaded run read "VMSUP-COUNTER 21121"
// from such a line and saw a jump).
func TestCounterValues(t *testing.T) {
	text := "VMSUP-COUNTER 0 0\r\n[ 1.2] virtio_blk\nVMSUP-COUNTER 1printf x\n 1\nVMSUP-COUNTER 2112" +
		"1 2\nVMSUP-COUNTER 3 3\nVMSUP-COUNTER 4 4\nxVMSUP-COUNTER 5 5junk\nVMSUP-COUNTER 6 6"
	if got, want := counterSequence(text), []int{0, Unreadable, Unreadable, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("counterSequence = %v, want %v", got, want)
	}
	if got, want := CounterValues(text), []int{0, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("CounterValues = %v, want %v", got, want)
	}
	CheckContinuous(t, counterSequence(text))
	for _, bad := range [][]int{{0, Unreadable, 3}, {0, 2}, {4, 3}} {
		ft := &fatalT{TB: t}
		func() { defer func() { recover() }(); CheckContinuous(ft, bad) }()
		if !ft.failed {
			t.Errorf("CheckContinuous(%v) passed, want a jump", bad)
		}
	}
}

// fatalT records a Fatalf instead of ending the test.
type fatalT struct {
	testing.TB
	failed bool
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(string, ...any) {
	f.failed = true
	panic("fatal")
}
