package spec

import (
	"strings"
	"testing"
)

// TestWatchdogModel: a watchdog defaults to the i6300esb; a model needs an
// action, a known name, and q35 for the TCO watchdog of its chipset; each
// error names watchdog_model.
func TestWatchdogModel(t *testing.T) {
	const head = "name = \"w\"\nmemory = \"256M\"\n[[disk]]\nname = \"d\"\nfile = \"/d.img\"\n"
	for _, c := range []struct{ body, model, err string }{
		{"watchdog = \"reset\"\n", WatchdogI6300ESB, ""},
		{"", "", ""},
		{"watchdog = \"poweroff\"\nwatchdog_model = \"itco\"\n", WatchdogITCO, ""},
		{"machine = \"pc\"\nwatchdog = \"pause\"\nwatchdog_model = \"ib700\"\n", WatchdogIB700, ""},
		{"machine = \"pc\"\nwatchdog = \"reset\"\nwatchdog_model = \"itco\"\n", "", `watchdog_model: "itco" is q35's chipset watchdog; machine "pc" has none`},
		{"watchdog_model = \"ib700\"\n", "", "watchdog_model: needs watchdog"},
		{"watchdog = \"reset\"\nwatchdog_model = \"diag288\"\n", "", `watchdog_model: unknown model "diag288"`},
	} {
		f, err := Parse("/w.toml", []byte(c.body+head))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.body, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v, want %q", c.body, err, c.err)
		case c.err == "" && f.VM.WatchdogModel != c.model:
			t.Errorf("%q: model %q, want %q", c.body, f.VM.WatchdogModel, c.model)
		}
	}
}
