// Package migration is live migration's machinery, apart from the VM
// lifecycle around it (supervisor.Migrate and Receive): the versioned
// protocol the source's vmsup speaks with the destination's "vmsup
// migrate-receive" over the transport's stdin/stdout (Peer, Msg), the relay
// that carries each QEMU's stream over TCP so that QEMU itself needs no
// network (Relay, with a per-connection token), TLS 1.3 between the relays
// with the destination's one-off certificate pinned (TLS, DialTLS), and the
// QMP driver of the source's stream (Stream: capabilities, parameters,
// events, progress, stall and timeout, postcopy switch, cancel).
//
// It knows nothing of units, records or confinement.
package migwire
