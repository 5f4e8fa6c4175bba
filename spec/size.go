package spec

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Size is a number of bytes. In TOML it is written as a string with an
// optional binary suffix: "512M", "4G", "1024K", "1T" (powers of 1024), or
// a plain integer of bytes.
type Size int64

// Common sizes.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

// valueError is a bad value text; Parse maps it back to its key.
type valueError struct{ text, msg string }

func (e *valueError) Error() string { return e.msg }

// ParseSize parses "512M", "4G", "4GiB", "100" (bytes).
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := Size(1)
	upper := strings.ToUpper(t)
	upper = strings.TrimSuffix(upper, "IB")
	upper = strings.TrimSuffix(upper, "B")
	switch {
	case strings.HasSuffix(upper, "K"):
		mult = KiB
	case strings.HasSuffix(upper, "M"):
		mult = MiB
	case strings.HasSuffix(upper, "G"):
		mult = GiB
	case strings.HasSuffix(upper, "T"):
		mult = TiB
	}
	if mult != 1 {
		upper = upper[:len(upper)-1]
	}
	n, err := strconv.ParseInt(strings.TrimSpace(upper), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q (want e.g. \"512M\" or \"4G\")", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("negative size %q", s)
	}
	if n > int64(1<<62)/int64(mult) {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return Size(n) * mult, nil
}

// UnmarshalText implements encoding.TextUnmarshaler for TOML strings.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return &valueError{string(b), err.Error()}
	}
	*s = v
	return nil
}

// MarshalText writes the shortest exact form ("512M").
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// String renders the size with the largest exact binary suffix.
func (s Size) String() string {
	for _, u := range []struct {
		m Size
		s string
	}{{TiB, "T"}, {GiB, "G"}, {MiB, "M"}, {KiB, "K"}} {
		if s != 0 && s%u.m == 0 {
			return strconv.FormatInt(int64(s/u.m), 10) + u.s
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// MiB returns the size in whole MiB, rounded up.
func (s Size) MiB() int64 { return int64((s + MiB - 1) / MiB) }

// Duration is a time.Duration written in TOML as "30s", "2m".
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return &valueError{string(b), fmt.Sprintf("invalid duration %q (want e.g. \"30s\" or \"2m\")", string(b))}
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
