package qmp

import (
	"testing"
	"time"
)

// TestLoadFactor: the load per CPU stretches waits from 1 to 4; an
// unreadable load is no stretch; the built-in command bound grows with it.
func TestLoadFactor(t *testing.T) {
	for _, c := range []struct {
		loadavg string
		cpus    int
		want    float64
	}{{"0.50 0.4 0.3 1/200 99", 2, 1}, {"6.00 5 5 9/200 99", 2, 3}, {"40 40 40 9/200 99", 2, 4}, {"", 2, 1}, {"x", 2, 1}} {
		if got := loadFactor(c.loadavg, c.cpus); got != c.want {
			t.Errorf("loadFactor(%q, %d) = %v, want %v", c.loadavg, c.cpus, got, c.want)
		}
	}
	o := &options{load: func() float64 { return 3 }}
	if got := o.timeoutFor("add-fd", DefaultCommandTimeout); got != 3*DefaultCommandTimeout {
		t.Errorf("add-fd's bound at load factor 3: %s", got)
	}
	if got := (&options{commandTimeout: time.Second}).timeoutFor("add-fd", DefaultCommandTimeout); got != time.Second {
		t.Errorf("a set command timeout is kept: %s", got)
	}
	at3 := func(o *options) { o.load = func() float64 { return 3 } }
	if got := buildOptions([]Option{at3}).connectTimeout; got != 3*DefaultConnectTimeout {
		t.Errorf("the greeting's bound at load factor 3: %s", got)
	}
	if got := buildOptions([]Option{at3, WithConnectTimeout(time.Second)}).connectTimeout; got != time.Second {
		t.Errorf("a set connect timeout is kept: %s", got)
	}
}
