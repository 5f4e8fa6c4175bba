package enrol

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/remoteapi"
)

// TestEnrol: the PKI is made once (keys 0600) and kept; a client's bundle
// checks out and is stored and found as a remote; a bundle whose
// certificate another CA signed is refused; a grant is appended once and
// the server reads it.
func TestEnrol(t *testing.T) {
	dir := t.TempDir()
	p, err := EnsurePKI(filepath.Join(dir, "pki"), []string{"vmhost", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{p.CAKeyFile(), p.ServerKeyFile()} {
		if st, err := os.Stat(k); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v; want 0600", k, st, err)
		}
	}
	ca, _ := os.ReadFile(p.CAFile())
	if again, err := EnsurePKI(p.Dir, nil); err != nil || string(again.CAPEM()) != string(ca) {
		t.Errorf("a second EnsurePKI made another CA (%v)", err)
	}
	cert, key, err := p.IssueClient("ci")
	if err != nil {
		t.Fatal(err)
	}
	b := &Bundle{Name: "ci", URL: "https://vmhost:8443", CA: string(ca), Cert: string(cert), Key: string(key)}
	got, err := ParseBundle(b.Marshal())
	if err != nil || got.URL != b.URL {
		t.Fatalf("ParseBundle: %+v, %v", got, err)
	}
	other, err := EnsurePKI(filepath.Join(dir, "other"), nil)
	if err != nil {
		t.Fatal(err)
	}
	forged := *b
	forged.CA = string(other.CAPEM())
	if _, err := ParseBundle(forged.Marshal()); err == nil || !strings.Contains(err.Error(), "not a client certificate of the bundle's CA") {
		t.Errorf("a bundle of another CA: %v", err)
	}

	rs := Remotes{Dir: filepath.Join(dir, "remotes")}
	if _, err := rs.Add("vmhost", b); err != nil {
		t.Fatal(err)
	}
	rem, err := rs.Get("vmhost")
	if err != nil || rem.URL != b.URL {
		t.Fatalf("Get: %+v, %v", rem, err)
	}
	if st, err := os.Stat(rem.Key); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the stored key: %v %v; want 0600", st, err)
	}
	if _, err := rs.Get("nosuch"); err == nil || !strings.Contains(err.Error(), "no such remote") {
		t.Errorf("Get nosuch: %v", err)
	}

	cfg := filepath.Join(dir, "remote.toml")
	if made, err := EnsureConfig(cfg, p); err != nil || !made {
		t.Fatalf("EnsureConfig: %v %v", made, err)
	}
	g := remoteapi.Grant{Identity: "cn:ci", Role: remoteapi.Operator, VMs: []string{"web*"}}
	for i, want := range []bool{true, false} {
		if added, err := AddGrant(cfg, g); err != nil || added != want {
			t.Errorf("AddGrant #%d: %v, %v; want added %v", i, added, err, want)
		}
	}
	c, err := remoteapi.LoadConfig(cfg)
	if err != nil || c.RoleFor("cn:ci", "web-1") != remoteapi.Operator || c.RoleFor("cn:ci", "db") != "" {
		t.Errorf("the config after AddGrant: %v", err)
	}
}
