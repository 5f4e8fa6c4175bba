// Package qmp is vmsup's client for the QEMU Machine Protocol (QMP) and for
// the QEMU guest agent (qemu-ga).
//
// It owns the wire: dialing the monitor's unix socket, the greeting and
// capability negotiation, matching replies to commands by id, per-command
// deadlines, fanning events out to subscribers, passing file descriptors
// (getfd, add-fd) with SCM_RIGHTS, and a small set of typed commands that vmsup
// uses (status, stop/cont, power, device/blockdev/netdev/object hotplug, CPU
// and block-node queries, block jobs with WaitJob, transactions, dirty
// bitmaps, NBD exports). The guest agent client (Agent) does the same for
// the qemu-ga channel, including guest-sync-delimited resynchronisation.
//
// It does not own QEMU processes, argv, systemd units, device models or the
// policy of what to do when QEMU goes away: callers watch Conn.Done and decide.
// It keeps no package-level state; each Conn or Agent is independent.
//
// # Why not go-qemu's SocketMonitor
//
// Conn implements go-qemu's qmp.Monitor interface and uses its qmp.Event and
// qmp.Version types, so code written against go-qemu (for example its raw
// package) runs on it. It does not use go-qemu's SocketMonitor transport,
// because that transport:
//   - has no deadlines: Connect and Run hang on a stopped QEMU;
//   - feeds events into one unbuffered channel from the reader goroutine, so a
//     command reply blocks while nobody drains events;
//   - reads with bufio.Scanner, whose 64 KiB line limit fails larger replies
//     such as query-qmp-schema;
//   - runs one command at a time without ids, and flattens QMP errors to
//     strings, losing the error class.
//
// # Timeouts
//
// Dial is bounded by its context and a connect timeout (2 s by default).
// Every command is bounded by its context and a per-command timeout: 500 ms by
// default, longer for commands known to be slow (see DefaultTimeout). A
// command that times out returns an error wrapping context.DeadlineExceeded
// and naming the command; the connection stays usable and a late reply is
// dropped.
//
// # Events
//
// Each subscriber gets its own buffered channel. The reader never waits for
// a subscriber: when a subscriber's buffer is full, its oldest queued event
// is dropped to make room for the newest, and Conn.DroppedEvents counts it.
// Subscribe before issuing the command whose events you need.
package qmp
