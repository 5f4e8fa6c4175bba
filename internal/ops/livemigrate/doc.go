// Package livemigrate is live migration's orchestration: the source side
// (Migrator.Migrate, Cancel), the destination (Receive, which starts its
// QEMU through the lifecycle's start pipeline), and the recovery of both
// when their vmsup dies. The protocol, the relay, the transports and the
// QMP stream driver are internal/ops/migwire's; the start pipeline, the
// guardians and the VM's unit handling are internal/machine's, called
// down to through its Env (env.StartIncoming, env.Guard, ...).
//
// The design (see also internal/ops/migwire):
//
//   - Daemonless, like rsync and Proxmox: the source runs the destination's
//     vmsup ("vmsup migrate-receive") through a transport command, ssh by
//     default, and speaks a small versioned protocol over its stdin/stdout.
//     The receiver listens on nothing, so only whoever the transport lets in
//     (ssh keys; root entering a namespace in tests) can drive it.
//   - KubeVirt's split: prepare (the destination starts QEMU from the same
//     spec with -S -incoming defer and listens on a port it picks), migrate
//     (the source's QEMU streams; vmsup watches MIGRATION events and
//     query-migrate), finalize (the destination checks the stream completed
//     and runs cont; only then does the source's QEMU quit).
//   - Any failure before finalize answers tears the destination down and
//     leaves the source running (QEMU resumes a failed or cancelled
//     migration's source itself; vmsup conts it if it is left paused after
//     "completed"). If finalize goes unanswered, the source stays paused:
//     the guest may already run on the destination, and two running copies
//     are worse than a paused one.
//   - On one host (--local) the receiver runs in-process over pipes, the new
//     QEMU runs under the VM's other unit name (vmstate.AltUnit) with its sockets in
//     STATE/incoming, and takes the usual socket names once the old QEMU is
//     gone. state.json records the current unit, so status, down and up
//     follow it.
//   - Disks on shared storage are proved shared by a marker file the
//     source drops beside each; a local file disk (its marker not seen by
//     the destination) is copied while the guest runs: storage_out.go and
//     storage_in.go.
package livemigrate
