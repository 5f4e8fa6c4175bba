package logs

import "strings"

// esc starts a terminal control sequence.
const esc = 0x1b

// Plain is a console line as a reader wants it: without the terminal
// control sequences a guest writes for its console (colours, cursor moves,
// erasing, window titles: ECMA-48 CSI, OSC and other ESC sequences) and
// without the other control characters but tab. The console log keeps the
// bytes as the guest wrote them.
func Plain(s string) string {
	if !hasControl(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == esc:
			i = skipEscape(s, i+1)
		case c < 0x20 && c != '\t' || c == 0x7f:
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return true
		}
	}
	return false
}

// skipEscape returns where the sequence whose ESC ended before i ends.
func skipEscape(s string, i int) int {
	if i >= len(s) {
		return i
	}
	switch c := s[i]; {
	case c == '[': // CSI: parameters and intermediates, then a final byte
		i++
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x3f {
			i++
		}
		if i < len(s) && s[i] >= 0x40 && s[i] <= 0x7e {
			i++
		}
		return i
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_': // a string, to BEL or ST (ESC \)
		for i++; i < len(s); i++ {
			if s[i] == 0x07 {
				return i + 1
			}
			if s[i] == esc {
				if i+1 < len(s) && s[i+1] == '\\' {
					return i + 2
				}
				return i // another sequence begins: the string was cut
			}
		}
		return i
	case c >= 0x20 && c <= 0x2f: // intermediates (a character set: ESC ( B), then a final byte
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
			i++
		}
		if i < len(s) && s[i] >= 0x30 && s[i] <= 0x7e {
			i++
		}
		return i
	case c >= 0x30 && c <= 0x7e: // one byte (ESC 7, ESC c, ESC M)
		return i + 1
	}
	return i
}
