package qemuargs

import "fmt"

// socketChardev is a listening unix-socket chardev that does not wait for a
// client: QEMU starts at once and the supervisor connects when it likes.
// LogFile, when set, gets a copy of everything the chardev receives (QEMU
// truncates it at start unless LogAppend), so console output is kept while
// no client is attached.
type socketChardev struct {
	ID, Path, LogFile string
	LogAppend         bool // a migration destination continues the log
}

func (c socketChardev) Args() ([]string, error) {
	p, err := escapeValue(c.Path)
	if err != nil {
		return nil, fmt.Errorf("chardev %q path: %w", c.ID, err)
	}
	v := "socket,id=" + c.ID + ",path=" + p + ",server=on,wait=off"
	if c.LogFile != "" {
		l, err := escapeValue(c.LogFile)
		if err != nil {
			return nil, fmt.Errorf("chardev %q logfile: %w", c.ID, err)
		}
		v += ",logfile=" + l
		if c.LogAppend {
			v += ",logappend=on"
		}
	}
	return []string{"-chardev", v}, nil
}

// qmpMonitor is a QMP monitor on a chardev.
type qmpMonitor struct{ Chardev string }

func (m qmpMonitor) Args() ([]string, error) {
	return []string{"-mon", "chardev=" + m.Chardev + ",mode=control"}, nil
}

// serialPort is the first serial port (ttyS0) on a chardev.
type serialPort struct{ Chardev string }

func (s serialPort) Args() ([]string, error) { return []string{"-serial", "chardev:" + s.Chardev}, nil }

// pipeChardev is QEMU's pipe chardev: it opens Path.in and Path.out (both
// must exist). On regular files it reads .in to its end and writes to .out:
// the event log (Options.EventLog). The end of .in closes the monitor's
// input but leaves its negotiated session, so events keep coming; that
// qmp_capabilities runs before the end is seen rests on the QMP monitor
// suspending its input while a command is queued (as I understand QEMU's
// monitor code; not re-read against 7.2 here) and was measured: 30 of 30
// starts under load, and every test since.
type pipeChardev struct{ ID, Path string }

func (c pipeChardev) Args() ([]string, error) {
	p, err := escapeValue(c.Path)
	if err != nil {
		return nil, fmt.Errorf("chardev %q path: %w", c.ID, err)
	}
	return []string{"-chardev", "pipe,id=" + c.ID + ",path=" + p}, nil
}

// EventLogInput is what the event log's .in file holds: the one command
// that makes QEMU send events to the monitor.
const EventLogInput = "{\"execute\":\"qmp_capabilities\"}\n"
