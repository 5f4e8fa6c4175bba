package units

import "testing"

func TestCPUMask(t *testing.T) {
	for _, c := range []struct {
		cpus []int
		want []byte
	}{{[]int{0}, []byte{1}}, {[]int{0, 1}, []byte{3}}, {[]int{9}, []byte{0, 2}}, {[]int{1, 8, 15}, []byte{2, 0x81}}} {
		if got := cpuMask(c.cpus); string(got) != string(c.want) {
			t.Errorf("cpuMask(%v) = %v, want %v", c.cpus, got, c.want)
		}
	}
}
