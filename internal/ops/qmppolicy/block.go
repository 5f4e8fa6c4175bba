package qmppolicy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

const blockdevAllows = `driver file (filename a path in the state directory, or /dev/fdset/N), host_device and host_cdrom ` +
	`(/dev/fdset/N only), raw, throttle, copy-on-read, null-co, null-aio, and qcow2 with its "file" given inline as a ` +
	`file node on a path in the state directory, "backing" given (null, a node name or a node) and "data-file" given ` +
	`if the image's header names one; children ("file", "backing", "data-file") and "json:" filenames are checked ` +
	`the same way`

// maxNodeDepth bounds how deep block nodes nest.
const maxNodeDepth = 8

func checkBlockdevAdd(c *call) error {
	args, err := expandDotted(c.args)
	if err != nil {
		return c.refuse(Form, "%v", err)
	}
	c.args = args
	return c.blockdev(c.args, "", 0, ReadWrite)
}

// blockdev checks one block node's options (BlockdevOptions, dotted keys
// already expanded) and its children; where names it in messages ("" =
// the arguments). mode is how QEMU opens the node's files unless its
// "read-only" says otherwise.
func (c *call) blockdev(o map[string]any, where string, depth int, mode Mode) error {
	if depth > maxNodeDepth {
		return c.refuse(Form, "%s", at(where, "block nodes nested too deep"))
	}
	driver, _ := str(o, "driver")
	if driver == "" {
		return c.refuse(Form, "%s", at(where, "a block node without a driver"))
	}
	if _, ok := blockOptions()[driver]; !ok {
		return c.refuseDriver(o, driver, where)
	}
	if err := c.blockKeys(o, driver, where); err != nil {
		return err
	}
	if ro, ok := o["read-only"].(bool); ok {
		mode = ReadWrite
		if ro {
			mode = ReadOnly
		}
	}
	switch driver {
	case "file":
		if _, ok := str(o, "filename"); !ok {
			return c.refuse(Form, "%s", at(where, `driver "file" without a filename`))
		}
		return c.filename(o, "filename", join(where, "filename"), depth, true, mode)
	case "host_device", "host_cdrom":
		if fn, _ := str(o, "filename"); !isFDSet(fn) {
			return c.refuse(HostPath, "%s", at(where, "driver "+driver+" opens the host device "+quote(fn)+": only /dev/fdset/N (one vmsup passed) passes"))
		}
		return nil
	case "raw", "throttle", "copy-on-read":
		return c.child(o, "file", where, depth, false, mode)
	case "qcow2":
		return c.qcow2(o, where, depth, mode)
	}
	return nil // null-co, null-aio
}

func quote(s string) string { b, _ := json.Marshal(short(s)); return string(b) }

// refuseDriver says why a block driver is not on the list.
func (c *call) refuseDriver(o map[string]any, driver, where string) error {
	switch {
	case isNetworkProtocol(driver):
		return c.refuse(Outbound, "%s", at(where, "driver "+quote(driver)+" connects to the network or a host socket"))
	case driver == "vvfat":
		dir, _ := str(o, "dir")
		return c.refuse(HostPath, "%s", at(where, `driver "vvfat" serves the host directory `+quote(dir)+" to the guest"))
	case driver == "blkdebug" || driver == "blklogwrites" || driver == "blkverify":
		return c.refuse(HostPath, "%s", at(where, "driver "+quote(driver)+" is a debugging driver that reads or writes host files of its own"))
	}
	return c.refuse(Form, "%s", at(where, "driver "+quote(driver)+" is not on the allow-list (file, raw, qcow2, throttle, copy-on-read, null-co, null-aio; host_device and host_cdrom with /dev/fdset/N)"))
}

// child checks the child key of node o: a node name, a node, or (nullOK)
// null.
func (c *call) child(o map[string]any, key, where string, depth int, nullOK bool, mode Mode) error {
	v, ok := o[key]
	if !ok {
		return nil
	}
	switch x := v.(type) {
	case string:
		return nil // an existing node, by name
	case nil:
		if nullOK {
			return nil
		}
	case map[string]any:
		return c.blockdev(x, join(where, key), depth+1, mode)
	}
	return c.refuse(Form, "%s", at(join(where, key), "neither a node name nor a node"))
}

// qcow2 checks a qcow2 node: QEMU opens the backing file and the external
// data file its header names unless they are given, so "backing" must be,
// and the header is read to see whether "data-file" must be; that needs
// the image's path, hence an inline file node.
func (c *call) qcow2(o map[string]any, where string, depth int, mode Mode) error {
	if _, ok := o["backing"]; !ok {
		return c.refuse(HostPath, "%s", at(where, `qcow2 without "backing" opens the backing file its header names: give "backing" (null, a node name or a node)`))
	}
	file, ok := o["file"].(map[string]any)
	if !ok {
		return c.refuse(Form, "%s", at(where, `qcow2's "file" must be a file node given inline (driver "file", a path in the state directory), so that vmsup can read the image's header`))
	}
	if err := c.blockdev(file, join(where, "file"), depth+1, mode); err != nil {
		return err
	}
	fn, _ := str(file, "filename")
	fn = strings.TrimPrefix(fn, "file:")
	if d, _ := str(file, "driver"); d != "file" || isFDSet(fn) || protocol(fn) != "" {
		return c.refuse(Form, "%s", at(join(where, "file"), `qcow2's file must be a file node on a path in the state directory, so that vmsup can read the image's header`))
	}
	if err := c.child(o, "backing", where, depth, true, ReadOnly); err != nil { // QEMU opens a backing chain read-only
		return err
	}
	if err := c.child(o, "data-file", where, depth, false, mode); err != nil {
		return err
	}
	if _, ok := o["data-file"]; !ok {
		if real, err := resolve(c.abs(fn)); err == nil && hasExternalDataFile(real) {
			return c.refuse(HostPath, "%s", at(where, `the image's header names an external data file, which QEMU would open: give "data-file"`))
		}
	}
	return nil
}

// hasExternalDataFile reports whether the file at path is a qcow2 image
// whose header has the external data file feature (incompatible feature
// bit 2). The file is opened without following a symlink and without
// blocking on a FIFO.
func hasExternalDataFile(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	h := make([]byte, 80)
	if _, err := io.ReadFull(f, h); err != nil {
		return false
	}
	if !bytes.Equal(h[:4], []byte{'Q', 'F', 'I', 0xfb}) || binary.BigEndian.Uint32(h[4:8]) < 3 {
		return false
	}
	return binary.BigEndian.Uint64(h[72:80])&(1<<2) != 0
}

func checkChangeMedium(c *call) error {
	if f, _ := str(c.args, "format"); f != "raw" {
		return c.refuse(Form, `format %q: only "raw" passes (no format probes the image; qcow2 opens the files its header names)`, short(f))
	}
	fn, ok := str(c.args, "filename")
	if !ok {
		return c.refuse(Form, "no filename")
	}
	var mode Mode
	switch m, _ := str(c.args, "read-only-mode"); m {
	case "", "retain":
		mode = MediumMode
	case "read-only":
		mode = ReadOnly
	case "read-write":
		mode = ReadWrite
	default:
		return c.refuse(Form, "read-only-mode %q is not one QEMU knows", short(m))
	}
	rest, isJSON := strings.CutPrefix(fn, "json:")
	if !isJSON {
		return c.filename(c.args, "filename", "filename", 0, false, mode)
	}
	// QEMU opens the medium with the driver "format" names; the node's own
	// driver must agree, or which one QEMU takes is a guess.
	node, err := c.jsonNode("filename", rest)
	if err != nil {
		return err
	}
	if _, ok := node["driver"]; !ok {
		node["driver"] = "raw"
	}
	if err := c.blockdev(node, `filename "json:"`, 1, mode); err != nil {
		return err
	}
	if d := node["driver"]; d != "raw" {
		return c.refuse(Form, `filename "json:": driver %s where format is "raw"`, quote(fmt.Sprint(d)))
	}
	c.jsonFilename(c.args, "filename", node)
	return nil
}

// checkNoFileNames refuses arguments that name image files rather than
// nodes.
func checkNoFileNames(keys ...string) func(*call) error {
	return func(c *call) error {
		for _, k := range keys {
			if _, ok := c.args[k]; ok {
				return c.refuse(HostPath, "%q names an image file, which QEMU looks up or writes into an image header: name nodes instead (top-node, base-node)", k)
			}
		}
		return nil
	}
}

// transactionActions are the transaction actions that pass.
func transactionActions() []string {
	return []string{"abort", "block-dirty-bitmap-add", "block-dirty-bitmap-remove", "block-dirty-bitmap-clear",
		"block-dirty-bitmap-enable", "block-dirty-bitmap-disable", "block-dirty-bitmap-merge", "blockdev-backup", "blockdev-snapshot"}
}

func checkTransaction(c *call) error {
	acts, ok := c.args["actions"].([]any)
	if !ok {
		return c.refuse(Form, `"actions" is not a list`)
	}
	for i, a := range acts {
		m, _ := a.(map[string]any)
		t, _ := str(m, "type")
		if !slices.Contains(transactionActions(), t) {
			return c.refuse(NotListed, "action %d: %q is not on the allow-list (%s)", i, short(t), strings.Join(transactionActions(), ", "))
		}
		data, _ := m["data"].(map[string]any)
		if r := lookup(t); r != nil && r.check != nil {
			if err := r.check(c.sub(data)); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkBlockExportAdd(c *call) error {
	switch t, _ := str(c.args, "type"); t {
	case "nbd":
		if w, _ := c.args["writable"].(bool); w {
			return c.refuse(Export, "a writable export lets the NBD server's clients write the guest's disk")
		}
		return nil
	case "vhost-user-blk":
		return c.refuse(Listener, "a vhost-user-blk export serves the guest's disk on a host socket")
	case "fuse":
		mp, _ := str(c.args, "mountpoint")
		return c.refuse(Export, "a fuse export mounts the guest's disk on the host at %q", short(mp))
	default:
		return c.refuse(Form, "export type %q is not on the allow-list (nbd)", short(t))
	}
}

func checkNBDServerStart(c *call) error {
	addr, ok := c.args["addr"].(map[string]any)
	if !ok {
		return c.refuse(Form, "no addr")
	}
	return c.socketAddrLegacy("addr", addr, Listener)
}

// parseObject reads s as one JSON object, strictly (see Parse).
func parseObject(s string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	o, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("not an object")
	}
	return o, nil
}

// isHugetlbfsDir reports whether the absolute path p is a directory on a
// hugetlbfs mount (QEMU makes an unlinked file of its own in it).
func isHugetlbfsDir(p string) bool {
	if !filepath.IsAbs(p) {
		return false
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return false
	}
	var st unix.Statfs_t
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() || unix.Statfs(real, &st) != nil {
		return false
	}
	return st.Type == unix.HUGETLBFS_MAGIC
}
