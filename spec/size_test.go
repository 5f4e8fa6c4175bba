package spec

import (
	"strings"
	"testing"
)

// Binary suffixes, with or without "iB", and plain bytes.
func TestParseSizeBinary(t *testing.T) {
	for in, want := range map[string]Size{
		"512M": 512 * MiB, "512MiB": 512 * MiB, "4G": 4 * GiB, "4GiB": 4 * GiB, "4gib": 4 * GiB,
		"1T": TiB, "1TiB": TiB, "1024K": MiB, "1024k": MiB, "1024KiB": MiB, "4096": 4096, "512B": 512, " 2G ": 2 * GiB,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

// Decimal SI forms are refused with a hint, never taken as binary.
func TestParseSizeRefusesDecimal(t *testing.T) {
	for in, want := range map[string]string{
		"1GB":   `"1GB" is ambiguous: write "1G" (GiB, 1024^3) or "1000M"`,
		"256MB": `"256MB" is ambiguous: write "256M" (MiB, 1024^2) or "256000K"`,
		"1kB":   `"1kB" is ambiguous: write "1K" (KiB, 1024) or "1000"`,
		"1KB":   `"1KB" is ambiguous: write "1K" (KiB, 1024) or "1000"`,
		"1TB":   `"1TB" is ambiguous: write "1T" (TiB, 1024^4) or "1000G"`,
		"2gb":   `"2gb" is ambiguous: write "2G" (GiB, 1024^3) or "2000M"`,
	} {
		got, err := ParseSize(in)
		if err == nil || err.Error() != want {
			t.Errorf("ParseSize(%q) = %v, %v; want error %s", in, got, err, want)
		}
	}
}

// In a VM file the refusal is a spec error at the key.
func TestDecimalSizeInFile(t *testing.T) {
	for key, want := range map[string]string{
		"memory = \"1GB\"":                        `s.toml:2:10: memory: "1GB" is ambiguous: write "1G" (GiB, 1024^3) or "1000M"`,
		"memory = \"256M\"\nmax_memory = \"1GB\"": `s.toml:3:14: max_memory: "1GB" is ambiguous: write "1G" (GiB, 1024^3) or "1000M"`,
		"memory = \"256MB\"":                      `s.toml:2:10: memory: "256MB" is ambiguous: write "256M" (MiB, 1024^2) or "256000K"`,
	} {
		_, err := Parse("s.toml", []byte("name = \"s\"\n"+key+"\n[boot]\nkernel = \"/k\"\n"))
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", key, err, want)
		}
	}
	_, err := Parse("s.toml", []byte("name = \"s\"\nmemory = \"256M\"\n[boot]\nkernel = \"/k\"\n[[disk]]\nname = \"d\"\nfile = \"/d.qcow2\"\nsize = \"10GB\"\n"))
	if err == nil || !strings.HasPrefix(err.Error(), `s.toml:8:8: disk[0].size: "10GB" is ambiguous`) {
		t.Errorf("disk size 10GB: %v", err)
	}
}

func TestParseSizeInvalid(t *testing.T) {
	for _, bad := range []string{"", "M", "GB", "xGB", "-1GB", "1.5GB", "1IB", "1PB", "1 G B"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %v, want an error", bad, got)
		}
	}
}
