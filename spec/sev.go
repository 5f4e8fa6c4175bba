package spec

// SEV is AMD Secure Encrypted Virtualization: the guest's memory is
// encrypted with a key the host cannot read. QEMU's sev-guest object,
// the machine's confidential-guest-support. It needs KVM on an AMD host
// with SEV enabled (vmsup validate checks the host).
type SEV struct {
	// Policy is the guest policy (AMD SEV API, section 3): bit 0 no
	// debugging, bit 1 no key sharing, ...; libvirt writes it in hex.
	Policy uint32 `toml:"policy"`
	// CBitPos is the page-table bit that marks memory encrypted and
	// ReducedPhysBits how many physical address bits encryption takes:
	// the host CPU's (CPUID 0x8000001F), as libvirt's domain capabilities
	// print them.
	CBitPos         int `toml:"cbitpos"`
	ReducedPhysBits int `toml:"reduced_phys_bits"`
}

// validateSEV: the C-bit and the reduced bits are the ranges x86's
// physical addresses allow, and SEV runs under KVM only.
func (f *File) validateSEV() error {
	s := f.VM.SEV
	switch {
	case s == nil:
		return nil
	case s.CBitPos < 32 || s.CBitPos > 63:
		return f.Errorf("sev.cbitpos", "%d is out of range 32..63 (the host's: CPUID 0x8000001F EBX[5:0])", s.CBitPos)
	case s.ReducedPhysBits < 1 || s.ReducedPhysBits > 63:
		return f.Errorf("sev.reduced_phys_bits", "%d is out of range 1..63", s.ReducedPhysBits)
	case f.VM.Accel == AccelTCG:
		return f.Errorf("sev", "memory encryption needs accel \"kvm\" (TCG cannot encrypt the guest's memory)")
	}
	return nil
}
