package machine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
)

// NotFound is the error for a VM name vmsup does not know: ErrNotFound,
// with the known VMs whose names are a likely typo of it (vm "wbe": no
// such VM (did you mean "web"?)).
func (s *Env) NotFound(name string) error { return vmerr.Wrap(name, s.unknownVM(name)) }

// unknownVM is notFound without the VM's name, for an error that names it
// further out.
func (s *Env) unknownVM(name string) error {
	known, _ := s.state.Known()
	near := nearNames(name, known)
	if len(near) == 0 {
		return ErrNotFound
	}
	for i, n := range near {
		near[i] = strconv.Quote(n)
	}
	return fmt.Errorf("%w (did you mean %s?)", ErrNotFound, strings.Join(near, " or "))
}

// nearNames are the names in known closest to name, if they are close
// enough to be a typo of it: at most one edit (a transposition is one) in
// every three letters, and fewer edits than name has letters.
func nearNames(name string, known []string) []string {
	best := max(1, len(name)/3)
	if best >= len(name) {
		best = len(name) - 1
	}
	var out []string
	for _, k := range known {
		switch d := typoDistance(name, k); {
		case k == name || d > best:
		case d < best:
			best, out = d, []string{k}
		default:
			out = append(out, k)
		}
	}
	return out
}

// typoDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of two adjacent bytes
// that turn a into b.
func typoDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
