package vncproxy

import (
	"errors"
	"testing"
)

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		addr   string
		public bool
		want   error
	}{
		{"127.0.0.1:0", false, nil},
		{"127.8.9.10:5900", false, nil},
		{"[::1]:0", false, nil},
		{"localhost:5900", false, nil},
		{"LOCALHOST:5900", false, nil},
		{"0.0.0.0:5900", false, ErrPublic},
		{":5900", false, ErrPublic},
		{"[::]:0", false, ErrPublic},
		{"192.0.2.7:0", false, ErrPublic},
		{"example.com:0", false, ErrPublic},
		{"0.0.0.0:5900", true, nil},
		{":5900", true, nil},
	} {
		err := CheckListen(c.addr, c.public)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("CheckListen(%q, %v) = %v, want %v", c.addr, c.public, err, c.want)
		}
	}
	if err := CheckListen("nonsense", false); err == nil || errors.Is(err, ErrPublic) {
		t.Errorf("CheckListen of an address without a port: %v", err)
	}
}
