package netsetup

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// OVS drives Open vSwitch through ovs-vsctl (see the package doc for why).
type OVS struct {
	// DB is the OVSDB server ovs-vsctl talks to ("unix:/path/db.sock");
	// "" is ovs-vsctl's default (/var/run/openvswitch/db.sock).
	DB string
	// Timeout bounds each ovs-vsctl call, including its wait for
	// ovs-vswitchd to apply the change; 0 means 10 s.
	Timeout time.Duration
	// Binary is ovs-vsctl's path; "" looks it up in PATH.
	Binary string
}

// OVSError is a failed ovs-vsctl call with what it said.
type OVSError struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *OVSError) Error() string {
	return fmt.Sprintf("ovs-vsctl %s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Stderr)
}
func (e *OVSError) Unwrap() error { return e.Err }

// ErrNoBridge means the OVS bridge does not exist.
var ErrNoBridge = errors.New("no such OVS bridge")

func (o OVS) run(ctx context.Context, args ...string) (string, error) {
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+2*time.Second)
	defer cancel()
	bin := o.Binary
	if bin == "" {
		bin = "ovs-vsctl"
	}
	full := []string{fmt.Sprintf("--timeout=%d", int(timeout/time.Second))}
	if o.DB != "" {
		full = append(full, "--db="+o.DB)
	}
	full = append(full, args...)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, full...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &OVSError{Args: args, Stderr: strings.TrimSpace(stderr.String()), Err: err}
	}
	return stdout.String(), nil
}

// CheckBridge returns nil if the OVS bridge exists, an error wrapping
// ErrNoBridge if not, or why ovs-vsctl could not tell.
func (o OVS) CheckBridge(ctx context.Context, bridge string) error {
	_, err := o.run(ctx, "br-exists", bridge)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return fmt.Errorf("%w %q", ErrNoBridge, bridge)
	}
	if err != nil {
		return fmt.Errorf("OVS bridge %q: %w", bridge, err)
	}
	return nil
}

// AddPort adds the tap as a port of bridge, tagged with the VM's name
// (external_ids:vmsup-vm). Marmot's fix for a crashed VM: if the add fails
// (a stale port of the same name is still on a bridge), the stale port of
// this name (the name is vmsup's, derived from the VM and NIC) and every
// port whose interface is in error (a crashed VM's tap that is gone: "could
// not open network device ...: No such device") are removed, and the add
// is tried once more. It returns the names of the ports it removed.
func (o OVS) AddPort(ctx context.Context, bridge, port, vm string) ([]string, error) {
	add := []string{"add-port", bridge, port, "--", "set", "Interface", port,
		"external_ids:vmsup-vm=" + vm}
	_, err := o.run(ctx, add...)
	if err == nil {
		return nil, nil
	}
	var removed []string
	if br, _ := o.PortBridge(ctx, port); br != "" {
		if derr := o.DelPort(ctx, port); derr != nil {
			return nil, fmt.Errorf("%w (and removing stale port %s: %v)", err, port, derr)
		}
		removed = append(removed, port)
	}
	// The deletion made ovs-vswitchd reconfigure, which marks ports whose
	// device is gone as in error.
	inErr, cerr := o.RemovePortsInError(ctx)
	removed = append(removed, inErr...)
	if cerr != nil {
		return removed, fmt.Errorf("%w (and removing ports in error: %v)", err, cerr)
	}
	if _, err := o.run(ctx, add...); err != nil {
		return removed, fmt.Errorf("OVS bridge %s: add port %s (retried after removing stale ports %v): %w", bridge, port, removed, err)
	}
	return removed, nil
}

// DelPort removes the port wherever it is; a missing one is not an error.
func (o OVS) DelPort(ctx context.Context, port string) error {
	if _, err := o.run(ctx, "--if-exists", "del-port", port); err != nil {
		return fmt.Errorf("OVS: delete port %s: %w", port, err)
	}
	return nil
}

// PortBridge returns the bridge the port is on, or "" if there is no such
// port.
func (o OVS) PortBridge(ctx context.Context, port string) (string, error) {
	out, err := o.run(ctx, "port-to-br", port)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// InterfaceError returns the error column of the interface ("" when fine).
func (o OVS) InterfaceError(ctx context.Context, name string) (string, error) {
	out, err := o.run(ctx, "--if-exists", "get", "Interface", name, "error")
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(out)
	if s == "[]" {
		return "", nil
	}
	return strings.Trim(s, `"`), nil
}

// PortsInError lists the interfaces whose error column is set.
func (o OVS) PortsInError(ctx context.Context) ([]string, error) {
	out, err := o.run(ctx, "--format=csv", "--no-headings", "--columns=name,error", "find", "Interface", "error!=[]")
	if err != nil {
		return nil, err
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("ovs-vsctl find: %w", err)
	}
	var names []string
	for _, r := range recs {
		if len(r) > 0 && r[0] != "" {
			names = append(names, strings.Trim(r[0], `"`))
		}
	}
	return names, nil
}

// RemovePortsInError deletes the ports whose interface is in error and
// returns their names.
func (o OVS) RemovePortsInError(ctx context.Context) ([]string, error) {
	names, err := o.PortsInError(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range names {
		if err := o.DelPort(ctx, n); err != nil {
			return removed, err
		}
		removed = append(removed, n)
	}
	return removed, nil
}

// ListPorts lists the ports of bridge.
func (o OVS) ListPorts(ctx context.Context, bridge string) ([]string, error) {
	out, err := o.run(ctx, "list-ports", bridge)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}
