package qmppolicy

import (
	"fmt"
	"strings"
)

// groups lists the groups in documentation order.
func groups() []Group {
	return []Group{Queries, RunState, Devices, BlockNodes, BlockJobs, Network, Objects, Migration, NBDExport, Display}
}

// Summary is the allow-list in a few lines for "vmsup qmp --help": each
// group's commands, the queries counted rather than listed.
func Summary() string {
	var b strings.Builder
	rules := Rules()
	for _, g := range groups() {
		var names []string
		if g == Queries {
			names = append(names, fmt.Sprintf("the %d query-* of QEMU 7.2", len(queryCommands())))
		}
		for _, r := range rules {
			if r.Group != g || g == Queries && strings.HasPrefix(r.Command, "query-") {
				continue
			}
			name := r.Command
			if r.check != nil {
				name += "*"
			}
			names = append(names, name)
		}
		text := wrap(g.String()+": "+strings.Join(names, ", "), 74)
		b.WriteString("  " + strings.ReplaceAll(text, "\n", "\n    ") + "\n")
	}
	b.WriteString("  (* = with its arguments checked)\n")
	return b.String()
}

// Markdown renders the allow-list as docs/qmp-policy.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString(`# Raw QMP: the allow-list of ` + "`vmsup qmp`" + `

<!-- Generated from internal/ops/qmppolicy (Rules); go test ./internal/ops/qmppolicy -run TestDoc -update rewrites it. -->

` + "`vmsup qmp NAME JSON`" + ` passes a command to the VM's QEMU without ` + "`--unsafe`" + ` only if it is on this list:
QEMU's read-only queries and the commands vmsup's own operations send, with their arguments checked. Everything
else is refused in one line that names the command and why, and passes with ` + "`--unsafe`" + `.

The model: QEMU is given objects, never names of host files. A name checked now can lead to another object when
QEMU resolves it later (a hard link, a symlink swapped in after the check, a qcow2 header's backing or data file,
a ` + "`json:`" + ` filename in any spelling), so vmsup opens the file itself, checks the descriptor, and QEMU gets
` + "`/dev/fdset/N`" + `. By name QEMU can reach only its own state directory; every image of the VM reached it as
a descriptor at start, with no ACL entry and no bind path. A raw command may not widen that: a filename outside the
state directory is refused however it is spelled, and one inside is opened by vmsup and passed as a descriptor.
The checks:

- **Paths.** A host path QEMU would open must be in the VM's state directory (` + "`ROOT/vms/NAME`" + `). A relative
  path is resolved against QEMU's real working directory (` + "`/proc/PID/cwd`" + `; vmsup starts QEMU in its state
  directory, and a VM started before that runs in ` + "`/`" + `), then cleaned; the symlinks of the part that exists are
  followed and must stay inside too, and a symlink to nothing is refused. ` + "`/dev/fdset/N`" + ` (descriptors only
  vmsup passes) is allowed where a block node opens a file.
- **Descriptors, not names.** A file in the state directory that a passed ` + "`blockdev-add`" + ` or
  ` + "`blockdev-change-medium`" + ` has QEMU open is opened by vmsup itself, beneath the state directory without following
  any symlink and with QEMU's user's permissions, checked (a regular file with exactly one link, or a block device)
  and passed to QEMU as a descriptor: the command QEMU gets names ` + "`/dev/fdset/N`" + `, read-only or read-write as the
  command asks. So QEMU never resolves a host name from raw QMP, and no symlink swapped in after the check or hard
  link to a host file reaches it. A file that fails is refused (host-path); the fd set is removed if QEMU fails the
  command.
- **Sockets.** No inet, vsock or descriptor address; a unix socket only in the state directory, never abstract.
- **Programs.** Nothing that runs one (` + "`exec:`" + `, guestfwd ` + "`cmd:`" + `, tap scripts and helpers, smbd).
- **Nesting.** A block node's children (` + "`file`" + `, ` + "`backing`" + `, ` + "`data-file`" + `), ` + "`json:`" + ` pseudo-protocol
  filenames and a transaction's actions are checked like the top; a filename with a network protocol prefix
  (` + "`nbd://`" + `, ` + "`http:`" + `, ...) is refused, ` + "`file:`" + ` is stripped, other prefixes are refused. Dotted keys
  (` + "`\"file.driver\"`" + `), in a ` + "`json:`" + ` filename or in block options, are expanded to the nested form first, so
  every spelling gets the same verdict, and the expanded form is what QEMU gets; a key with an empty part, a name
  given twice, or an option the driver does not have (a format node's legacy ` + "`filename`" + `) is refused.
- **Parsing.** The command must be one JSON object with ` + "`execute`" + `, optional ` + "`arguments`" + ` and ` + "`id`" + `, valid
  UTF-8, no duplicate keys, no NUL in a string: where QEMU's parser and vmsup's could read it differently it is
  refused.

A refusal's class (` + "`qmppolicy.Class`" + `) is one of: listener, outbound, host-path, program, export, descriptor,
ends, form (an argument form the list does not know), not-listed, malformed.

Known limits: the checks read the host when the command is checked; a file the guest can write (a raw image in the
state directory) could change between the check of a qcow2 header and QEMU's open. Files other commands name
(` + "`screendump`" + `, a secret's or ROM's file, sockets) are still checked by name and opened by QEMU. A raw
` + "`block-export-add`" + ` serves on whatever NBD server runs: a raw ` + "`nbd-server-start`" + ` is confined to the state
directory, ` + "`vmsup export`" + `'s server is where its operator put it.

`)
	rules := Rules()
	for _, g := range groups() {
		fmt.Fprintf(&b, "## %s\n\n", g)
		var any []string
		var checked []Rule
		for _, r := range rules {
			switch {
			case r.Group != g:
			case r.Allows == "":
				any = append(any, "`"+r.Command+"`")
			default:
				checked = append(checked, r)
			}
		}
		if len(any) > 0 {
			b.WriteString(wrap("Any arguments: "+strings.Join(any, ", ")+".", 116) + "\n\n")
		}
		if len(checked) > 0 {
			b.WriteString("| command | what passes |\n|---|---|\n")
			for _, r := range checked {
				fmt.Fprintf(&b, "| `%s` | %s |\n", r.Command, strings.ReplaceAll(r.Allows, "|", `\|`))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("## Refused on purpose\n\nEverything not listed above is refused; among them:\n\n| command | why (class) |\n|---|---|\n")
	for _, r := range refusals() {
		fmt.Fprintf(&b, "| `%s` | %s (%s) |\n", strings.Join(r.commands, "`, `"), r.why, r.class)
	}
	b.WriteString(`
## The audit logs

Every raw command, passed or refused, is logged in ` + "`ROOT/records/NAME/qmp.log`" + ` and to the systemd journal; the
refused ones and those passed with ` + "`--unsafe`" + ` also in ` + "`ROOT/records/NAME/qmp-security.log`" + `, which ordinary
traffic never writes. An entry is bounded: the command with long strings shortened, at most 4 KiB, its size and the
SHA-256 of the whole. Each log keeps one old file (` + "`.1`" + `); when a rotation drops entries, the new file's first line
says how many have been lost in all. Refusals, which anyone can send by the thousand, take at most half of either
log: a flood of them drops the oldest refusals (the first line counts them: "N more refusals suppressed") and never
rotates an ` + "`--unsafe`" + ` or passed entry out. A command is not sent if its entries cannot be written.
`)
	return b.String()
}

// wrap breaks s into lines of at most width bytes at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		if i > 0 && n+1+len(w) > width {
			b.WriteByte('\n')
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
