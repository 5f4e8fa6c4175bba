// Package remoteapi is vmsup's network API: the operations the CLI runs
// (Ops, the methods of *supervisor.Supervisor it calls) served as HTTP+JSON
// over mutual TLS and over a local unix socket, to a short-lived server that
// systemd starts when a connection arrives and that exits when idle, so no
// vmsup process runs while nobody calls.
//
// It owns the wire (the routes, their bodies and errors, openapi.json which
// describes them), who may do what (Config: a client's identity, from its
// certificate or its peer credentials, mapped to a role per VM name
// pattern), the audit of every call, the limits (request size, calls per
// client, deadlines, idle connections) and where files submitted by content
// are kept. It does not implement any operation: each handler calls the
// same Ops method the local CLI calls, and files submitted remotely go
// through the same spec parsing and host-path checks (the supervisor's
// Validate) as local ones.
//
// Package remoteapi/client is the Go client; it implements Ops, so the CLI
// drives a remote host by swapping the supervisor for it.
package remoteapi
