package qmppolicy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// QEMU reads block options flattened: {"file":{"driver":"file"}} and
// {"file.driver":"file"} are the same option (qdict_flatten, then
// qdict_crumple), and a "json:" filename may mix both. The walker knows
// only the nested form, so every block options object is brought to it
// first; a spelling the expansion cannot read the way QEMU would is
// refused rather than guessed.

// errDotted is why a block options object cannot be expanded.
type errDotted struct{ reason string }

func (e *errDotted) Error() string { return e.reason }

// expandDotted returns o with every dotted key ("file.driver") moved into
// the nested objects it names, merged with those given nested. A key with
// an empty part ("a..b", ".a", "a."; QEMU reads ".." as an escaped dot), a
// name given twice, or a name that is both a value and an object is an
// error.
func expandDotted(o map[string]any) (map[string]any, error) {
	flat := map[string]any{}
	if err := flatten("", o, flat); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		if err := place(out, strings.Split(k, "."), flat[k]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// flatten adds the leaves of o to flat under their dotted names.
func flatten(prefix string, o map[string]any, flat map[string]any) error {
	for k, v := range o {
		if k == "" || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
			return &errDotted{fmt.Sprintf("key %q has an empty part (QEMU reads \"..\" as an escaped dot)", short(k))}
		}
		name := k
		if prefix != "" {
			name = prefix + "." + k
		}
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			if err := flatten(name, m, flat); err != nil {
				return err
			}
			continue
		}
		if _, dup := flat[name]; dup {
			return &errDotted{fmt.Sprintf("%q is given twice (nested and dotted)", short(name))}
		}
		flat[name] = v
	}
	return nil
}

// place sets the value at path in out, making the objects on the way.
func place(out map[string]any, path []string, v any) error {
	m := out
	for i, p := range path[:len(path)-1] {
		switch x := m[p].(type) {
		case nil:
			if _, set := m[p]; set {
				return &errDotted{fmt.Sprintf("%q is both a value and an object", short(strings.Join(path[:i+1], ".")))}
			}
			n := map[string]any{}
			m[p], m = n, n
		case map[string]any:
			m = x
		default:
			return &errDotted{fmt.Sprintf("%q is both a value and an object", short(strings.Join(path[:i+1], ".")))}
		}
	}
	last := path[len(path)-1]
	if prev, set := m[last]; set {
		_, prevObj := prev.(map[string]any)
		if vm, ok := v.(map[string]any); ok && len(vm) == 0 && prevObj {
			return nil // an empty object beside the same object with members
		}
		return &errDotted{fmt.Sprintf("%q is both a value and an object", short(strings.Join(path, ".")))}
	}
	m[last] = v
	return nil
}
