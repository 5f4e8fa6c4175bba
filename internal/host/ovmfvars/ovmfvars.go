// Package ovmfvars reads the Secure Boot keys a VM's UEFI variable store
// (OVMF_VARS.fd) holds: the certificates in PK, KEK, db and dbx, and
// whether Secure Boot is enforced. It only reads; vmsup changes a store by
// copying a template at a VM's first start.
//
// The format is edk2's: a firmware volume whose header is followed by an
// authenticated variable store (VARIABLE_STORE_HEADER), a packed list of
// AUTHENTICATED_VARIABLE_HEADER + UTF-16 name + data, each 4-byte aligned.
// Key variables hold EFI_SIGNATURE_LISTs (UEFI 2.9, 32.4.1).
package ovmfvars

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode/utf16"
)

// Cert is one X.509 certificate enrolled in a key variable.
type Cert struct {
	Var      string    `json:"var"` // "PK", "KEK", "db" or "dbx"
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"not_after"`
}

// Store is what a variable store says about Secure Boot.
type Store struct {
	// Enforced: a PK is enrolled (user mode) and OVMF's SecureBootEnable is
	// not off, so the firmware checks what it boots.
	Enforced bool   `json:"enforced"`
	Certs    []Cert `json:"certs,omitempty"`
	// Hashes counts the SHA-256 entries (dbx revocations mostly).
	Hashes int `json:"hashes,omitempty"`
}

var (
	authVarStoreGUID = guid("aaf32c78-947b-439a-a180-2e144ec37792")
	certX509GUID     = guid("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
	certSHA256GUID   = guid("c1c41626-504c-4092-aca9-41f936934328")
)

const (
	varHeaderSize = 60     // AUTHENTICATED_VARIABLE_HEADER
	varStartID    = 0x55AA // its StartId
	varAdded      = 0x3F   // State: added, not deleted
	varInDelete   = 0x3E   // State: added, in deleted transition (still the live copy)
	storeHdrSize  = 28     // VARIABLE_STORE_HEADER
	fvSignature   = "_FVH" // at offset 40 of the firmware volume header
)

// Read reads the store in the file at path.
func Read(path string) (Store, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Store{}, err
	}
	st, err := Parse(b)
	if err != nil {
		return Store{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// Parse reads a variable store image.
func Parse(b []byte) (Store, error) {
	vars, err := variables(b)
	if err != nil {
		return Store{}, err
	}
	var st Store
	pk, sbEnable := false, true
	for _, v := range vars {
		switch v.name {
		case "PK", "KEK", "db", "dbx":
			certs, hashes := signatureLists(v.data)
			for _, c := range certs {
				c.Var = v.name
				st.Certs = append(st.Certs, c)
			}
			st.Hashes += hashes
			if v.name == "PK" && len(v.data) > 0 {
				pk = true
			}
		case "SecureBootEnable": // OVMF's own switch (its setup menu's)
			sbEnable = len(v.data) > 0 && v.data[0] != 0
		}
	}
	st.Enforced = pk && sbEnable
	return st, nil
}

type variable struct {
	name string
	data []byte
}

func variables(b []byte) ([]variable, error) {
	if len(b) < 56 || string(b[40:44]) != fvSignature {
		return nil, errors.New("not a UEFI variable store (no firmware volume header)")
	}
	off := int(binary.LittleEndian.Uint16(b[48:]))
	if off+storeHdrSize > len(b) || !bytes.Equal(b[off:off+16], authVarStoreGUID[:]) {
		return nil, errors.New("not an authenticated variable store")
	}
	end := off + int(binary.LittleEndian.Uint32(b[off+16:]))
	if end > len(b) {
		end = len(b)
	}
	var out []variable
	for p := off + storeHdrSize; p+varHeaderSize <= end; {
		if binary.LittleEndian.Uint16(b[p:]) != varStartID {
			break // the free space after the last variable
		}
		state := b[p+2]
		nameSize := int(binary.LittleEndian.Uint32(b[p+36:]))
		dataSize := int(binary.LittleEndian.Uint32(b[p+40:]))
		n := p + varHeaderSize
		if nameSize < 0 || dataSize < 0 || n+nameSize+dataSize > end {
			return nil, fmt.Errorf("variable at offset %d runs past the store", p)
		}
		if state == varAdded || state == varInDelete {
			out = append(out, variable{name: ucs2(b[n : n+nameSize]), data: b[n+nameSize : n+nameSize+dataSize]})
		}
		p = (n + nameSize + dataSize + 3) &^ 3
	}
	return out, nil
}

// signatureLists reads the X.509 certificates and counts the SHA-256
// hashes in a key variable's EFI_SIGNATURE_LISTs; what it cannot read it
// skips.
func signatureLists(d []byte) (certs []Cert, hashes int) {
	for len(d) >= 28 {
		var typ [16]byte
		copy(typ[:], d)
		listSize := int(binary.LittleEndian.Uint32(d[16:]))
		hdrSize := int(binary.LittleEndian.Uint32(d[20:]))
		sigSize := int(binary.LittleEndian.Uint32(d[24:]))
		if listSize < 28+hdrSize || listSize > len(d) || sigSize <= 16 {
			return certs, hashes
		}
		for e := 28 + hdrSize; e+sigSize <= listSize; e += sigSize {
			entry := d[e+16 : e+sigSize] // after the owner GUID
			switch typ {
			case certX509GUID:
				if c, err := x509.ParseCertificate(entry); err == nil {
					certs = append(certs, Cert{Subject: cmp.Or(c.Subject.CommonName, c.Subject.String()), NotAfter: c.NotAfter})
				}
			case certSHA256GUID:
				hashes++
			}
		}
		d = d[listSize:]
	}
	return certs, hashes
}

// Warning is what an operator must hear about st, "" if nothing: a db
// whose only Microsoft CAs are those of 2011, which expired in June 2026
// (boot loaders and option ROMs signed with the 2023 CAs are refused).
func (st Store) Warning() string {
	old, new := false, false
	for _, c := range st.Certs {
		if c.Var != "db" || !strings.Contains(c.Subject, "Microsoft") && !strings.Contains(c.Subject, "Windows") {
			continue
		}
		switch {
		case strings.Contains(c.Subject, "2011"):
			old = true
		case strings.Contains(c.Subject, "2023"):
			new = true
		}
	}
	if old && !new {
		return "db holds only Microsoft's 2011 CAs, which expired in June 2026: boot loaders signed with the 2023 CAs are refused " +
			"(add them, e.g. virt-fw-vars --add-db, or use a newer vars_template)"
	}
	return ""
}

func ucs2(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		c := binary.LittleEndian.Uint16(b[i:])
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}

// guid encodes a GUID string the way EFI stores it (the first three
// fields little-endian).
func guid(s string) [16]byte {
	var g [16]byte
	var a uint32
	var b, c uint16
	var rest [8]byte
	h := strings.ReplaceAll(s, "-", "")
	fmt.Sscanf(h[0:8], "%x", &a)
	fmt.Sscanf(h[8:12], "%x", &b)
	fmt.Sscanf(h[12:16], "%x", &c)
	for i := range rest {
		fmt.Sscanf(h[16+2*i:18+2*i], "%x", &rest[i])
	}
	binary.LittleEndian.PutUint32(g[0:], a)
	binary.LittleEndian.PutUint16(g[4:], b)
	binary.LittleEndian.PutUint16(g[6:], c)
	copy(g[8:], rest[:])
	return g
}
