package qmppolicy

import (
	"encoding/json"
	"maps"
	"slices"
)

// The options a block node of an allowed driver may have (QEMU 7.2's
// BlockdevOptions and the driver's own). An option the walker does not
// know is refused, not passed on: a "json:" filename also takes the
// legacy forms of bdrv_open, where a format node's "filename" or a
// "backing.file.filename" opens a file the walker would not have seen.

// blockCommon are BlockdevOptions' members every driver has.
func blockCommon() []string {
	return []string{"driver", "node-name", "discard", "cache", "read-only", "auto-read-only", "force-share", "detect-zeroes"}
}

// blockOptions maps each allowed driver to its own options.
func blockOptions() map[string][]string {
	file := []string{"filename", "pr-manager", "locking", "aio", "aio-max-batch", "drop-cache", "x-check-cache-dropped"}
	null := []string{"size", "latency-ns", "read-zeroes"}
	return map[string][]string{
		"file": file, "host_device": file, "host_cdrom": file,
		"raw":          {"file", "offset", "size"},
		"throttle":     {"file", "throttle-group"},
		"copy-on-read": {"file", "bottom"},
		"null-co":      null, "null-aio": null,
		"qcow2": {"file", "backing", "data-file", "lazy-refcounts", "pass-discard-request", "pass-discard-snapshot",
			"pass-discard-other", "overlap-check", "cache-size", "l2-cache-size", "l2-cache-entry-size",
			"refcount-cache-size", "cache-clean-interval", "encrypt"},
	}
}

// blockChildren are the options whose value is a node (or a node name),
// which child checks.
func blockChildren() []string { return []string{"file", "backing", "data-file"} }

// blockObjects are the options whose value may be an object of scalars
// (cache's direct and no-flush, encrypt's format and key-secret,
// overlap-check's flags).
func blockObjects() []string { return []string{"cache", "encrypt", "overlap-check"} }

// blockKeys refuses an option of o that driver does not have, and a value
// other than a scalar where the option is not a child or one of
// blockObjects.
func (c *call) blockKeys(o map[string]any, driver, where string) error {
	own := blockOptions()[driver]
	for _, k := range slices.Sorted(maps.Keys(o)) {
		if !slices.Contains(blockCommon(), k) && !slices.Contains(own, k) {
			return c.refuse(Form, "%s", at(where, "option "+quote(k)+" is not one the allow-list knows for driver "+quote(driver)))
		}
		if slices.Contains(blockChildren(), k) {
			continue
		}
		v := o[k]
		if m, ok := v.(map[string]any); ok && slices.Contains(blockObjects(), k) {
			for mk, mv := range m {
				if !isScalar(mv) {
					return c.refuse(Form, "%s", at(join(where, k), "member "+quote(mk)+" is not a string, number or boolean"))
				}
			}
			continue
		}
		if !isScalar(v) {
			return c.refuse(Form, "%s", at(join(where, k), "not a string, number or boolean"))
		}
	}
	return nil
}

// isScalar reports whether v is a JSON string, number or boolean.
func isScalar(v any) bool {
	switch v.(type) {
	case string, bool, json.Number:
		return true
	}
	return false
}
