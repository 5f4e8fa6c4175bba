package ovmfvars

import (
	"os"
	"strings"
	"testing"
)

// TestDebianTemplates reads the variable stores Debian's ovmf ships: the
// empty one enforces nothing; the Microsoft one has Debian's PK and
// Microsoft's 2011 CAs only (the warning); the snakeoil one its test key.
func TestDebianTemplates(t *testing.T) {
	cases := []struct {
		file     string
		enforced bool
		certs    []string // "VAR SUBJECT", in store order
		warn     bool
	}{
		{"OVMF_VARS_4M.fd", false, nil, false},
		{"OVMF_VARS_4M.ms.fd", true, []string{
			"db Microsoft Windows Production PCA 2011", "db Microsoft Corporation UEFI CA 2011",
			"KEK Debian UEFI Secure Boot (PK/KEK key)", "KEK Microsoft Corporation KEK CA 2011",
			"PK Debian UEFI Secure Boot (PK/KEK key)"}, true},
		{"OVMF_VARS_4M.snakeoil.fd", true, []string{
			"db O=SnakeOil,L=Fort Collins,ST=Colorado,C=US", "KEK O=SnakeOil,L=Fort Collins,ST=Colorado,C=US",
			"PK O=SnakeOil,L=Fort Collins,ST=Colorado,C=US"}, false},
	}
	for _, c := range cases {
		path := "/usr/share/OVMF/" + c.file
		if _, err := os.Stat(path); err != nil {
			t.Skipf("%s: %v (the ovmf package is not installed)", path, err)
		}
		st, err := Read(path)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, cert := range st.Certs {
			got = append(got, cert.Var+" "+cert.Subject)
		}
		if st.Enforced != c.enforced || strings.Join(got, "\n") != strings.Join(c.certs, "\n") || (st.Warning() != "") != c.warn {
			t.Errorf("%s: enforced %v, certs\n%s\nwarning %q; want enforced %v, certs\n%s\nwarning: %v",
				c.file, st.Enforced, strings.Join(got, "\n"), st.Warning(), c.enforced, strings.Join(c.certs, "\n"), c.warn)
		}
	}
}

func TestNotAStore(t *testing.T) {
	if _, err := Parse(make([]byte, 4096)); err == nil || !strings.Contains(err.Error(), "not a UEFI variable store") {
		t.Errorf("zeros: %v", err)
	}
}
