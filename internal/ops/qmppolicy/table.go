package qmppolicy

import "strings"

// Group is a part of the allow-list, for its documentation.
type Group int

// The groups of the allow-list, in the order the documentation lists them.
const (
	Queries Group = iota + 1
	RunState
	Devices
	BlockNodes
	BlockJobs
	Network
	Objects
	Migration
	NBDExport
	Display
)

func (g Group) String() string {
	switch g {
	case Queries:
		return "Read-only queries"
	case RunState:
		return "Run state"
	case Devices:
		return "Devices"
	case BlockNodes:
		return "Block nodes and media"
	case BlockJobs:
		return "Block jobs, bitmaps, transactions"
	case Network:
		return "Network"
	case Objects:
		return "Objects"
	case Migration:
		return "Migration"
	case NBDExport:
		return "NBD export"
	case Display:
		return "Display"
	}
	return "other"
}

// Rule is one command on the allow-list.
type Rule struct {
	Command string
	Group   Group
	// Allows says which arguments pass ("" = any: the command names only
	// QEMU's own objects).
	Allows string
	check  func(*call) error // nil = any arguments
}

// queryCommands are QEMU 7.2's query-* commands (query-qmp-schema of the
// installed binary): each only reads.
func queryCommands() []string {
	return strings.Fields(`query-acpi-ospm-status query-balloon query-block query-block-exports query-block-jobs
		query-blockstats query-chardev query-chardev-backends query-colo-status query-command-line-options
		query-commands query-cpu-definitions query-cpu-model-expansion query-cpus-fast query-current-machine
		query-dirty-rate query-display-options query-dump query-dump-guest-memory-capability query-fdsets
		query-hotpluggable-cpus query-iothreads query-jobs query-kvm query-machines query-memdev
		query-memory-devices query-memory-size-summary query-mice query-migrate query-migrate-capabilities
		query-migrate-parameters query-name query-named-block-nodes query-pci query-pr-managers
		query-qmp-schema query-replay query-rocker query-rocker-of-dpa-flows query-rocker-of-dpa-groups
		query-rocker-ports query-rx-filter query-sev query-sev-attestation-report query-sev-capabilities
		query-sev-launch-measure query-sgx query-sgx-capabilities query-spice query-stats
		query-stats-schemas query-status query-target query-tpm query-tpm-models query-tpm-types
		query-uuid query-vcpu-dirty-limit query-version query-vm-generation-id query-vnc
		query-vnc-servers query-xen-replication-status query-yank`)
}

// Rules returns the allow-list: every command "vmsup qmp" passes without
// --unsafe, with what its arguments may be.
func Rules() []Rule {
	var r []Rule
	for _, q := range queryCommands() {
		r = append(r, Rule{Command: q, Group: Queries})
	}
	r = append(r,
		Rule{"qom-list", Queries, "", nil},
		Rule{"qom-get", Queries, "", nil},
		Rule{"qom-list-types", Queries, "", nil},
		Rule{"qom-list-properties", Queries, "", nil},
		Rule{"device-list-properties", Queries, "", nil},
		Rule{"human-monitor-command", Queries, `only "info ..." (HMP can do anything QMP can, and more)`, checkHMP},

		Rule{"stop", RunState, "", nil},
		Rule{"cont", RunState, "", nil},
		Rule{"system_powerdown", RunState, "", nil},
		Rule{"system_reset", RunState, "", nil},
		Rule{"set-action", RunState, "", nil},
		Rule{"balloon", RunState, "", nil},
		Rule{"qom-set", RunState, `only the balloon's "guest-stats-polling-interval"`, checkQOMSet},

		Rule{"device_add", Devices, "drivers " + strings.Join(deviceDrivers(), ", ") + ` and vCPU types (*-x86_64-cpu, *-i386-cpu); "romfile" empty or a path in the state directory`, checkDeviceAdd},
		Rule{"device_del", Devices, "", nil},

		Rule{"blockdev-add", BlockNodes, blockdevAllows, checkBlockdevAdd},
		Rule{"blockdev-del", BlockNodes, "", nil},
		Rule{"block_resize", BlockNodes, "", nil},
		Rule{"block_set_io_throttle", BlockNodes, "", nil},
		Rule{"blockdev-change-medium", BlockNodes, `format "raw", filename a path in the state directory (or a "json:" node that blockdev-add would pass)`, checkChangeMedium},
		Rule{"blockdev-open-tray", BlockNodes, "", nil},
		Rule{"blockdev-close-tray", BlockNodes, "", nil},
		Rule{"blockdev-remove-medium", BlockNodes, "", nil},
		Rule{"blockdev-insert-medium", BlockNodes, "", nil},
		Rule{"blockdev-snapshot", BlockNodes, "", nil},

		Rule{"blockdev-backup", BlockJobs, "", nil},
		Rule{"blockdev-mirror", BlockJobs, "", nil},
		Rule{"block-commit", BlockJobs, `nodes by name: no "top", "base" or "backing-file" (file names QEMU writes into image headers)`, checkNoFileNames("top", "base", "backing-file")},
		Rule{"block-stream", BlockJobs, `nodes by name: no "base" or "backing-file"`, checkNoFileNames("base", "backing-file")},
		Rule{"block-job-cancel", BlockJobs, "", nil},
		Rule{"job-complete", BlockJobs, "", nil},
		Rule{"job-cancel", BlockJobs, "", nil},
		Rule{"job-finalize", BlockJobs, "", nil},
		Rule{"job-dismiss", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-add", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-remove", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-clear", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-enable", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-disable", BlockJobs, "", nil},
		Rule{"block-dirty-bitmap-merge", BlockJobs, "", nil},
		Rule{"transaction", BlockJobs, "actions " + strings.Join(transactionActions(), ", ") + ", each checked as its command", checkTransaction},

		Rule{"netdev_add", Network, netdevAllows, checkNetdevAdd},
		Rule{"netdev_del", Network, "", nil},
		Rule{"set_link", Network, "", nil},

		Rule{"object-add", Objects, objectAllows, checkObjectAdd},
		Rule{"object-del", Objects, "", nil},

		Rule{"migrate", Migration, `uri "unix:PATH" with PATH in the state directory`, checkMigrateURI(false)},
		Rule{"migrate-incoming", Migration, `uri "unix:PATH" with PATH in the state directory`, checkMigrateURI(true)},
		Rule{"migrate-set-capabilities", Migration, "", nil},
		Rule{"migrate-set-parameters", Migration, "", nil},
		Rule{"migrate_cancel", Migration, "", nil},
		Rule{"migrate-start-postcopy", Migration, "", nil},
		Rule{"migrate-continue", Migration, "", nil},

		Rule{"nbd-server-start", NBDExport, `addr a unix socket in the state directory (not abstract)`, checkNBDServerStart},
		Rule{"nbd-server-stop", NBDExport, "", nil},
		Rule{"block-export-add", NBDExport, `type "nbd", not writable (it serves on the NBD server, whose raw start is confined to the state directory)`, checkBlockExportAdd},
		Rule{"block-export-del", NBDExport, "", nil},

		Rule{"screendump", Display, "filename a path in the state directory", checkScreendump},
		Rule{"set_password", Display, `protocol "vnc"`, checkVNCPassword},
		Rule{"expire_password", Display, `protocol "vnc"`, checkVNCPassword},
	)
	return r
}

// lookup is the rule for command name, nil if it is not on the list.
func lookup(name string) *Rule {
	for _, r := range Rules() {
		if r.Command == name {
			return &r
		}
	}
	return nil
}

// refusal is a group of commands refused on purpose, with why: the
// documentation lists them, and their refusal says so (everything else not
// on the list is refused as NotListed).
type refusal struct {
	commands []string
	class    Class
	why      string
}

func refusals() []refusal {
	return []refusal{
		{[]string{"quit"}, Ends, "it ends QEMU without vmsup's stop steps: use vmsup down"},
		{[]string{"chardev-add", "chardev-change", "chardev-remove"}, NotListed, "host files, sockets and terminals: not an operation vmsup makes"},
		{[]string{"getfd", "closefd", "add-fd", "remove-fd"}, Descriptor, "descriptors are vmsup's own, and the CLI cannot pass one"},
		{[]string{"drive-backup", "drive-mirror", "blockdev-snapshot-sync", "blockdev-create", "dump-guest-memory", "memsave", "pmemsave"},
			HostPath, "it writes a host file by name"},
		{[]string{"migrate-recover", "snapshot-save", "snapshot-load", "x-*"}, NotListed, "not an operation vmsup makes"},
	}
}

// refuseUnlisted is the refusal of a command not on the allow-list.
func refuseUnlisted(name string) *Refusal {
	for _, r := range refusals() {
		for _, c := range r.commands {
			if c == name || strings.HasSuffix(c, "*") && strings.HasPrefix(name, strings.TrimSuffix(c, "*")) {
				return &Refusal{Command: name, Class: r.class, Reason: r.why + "; it is not on the allow-list of raw QMP commands"}
			}
		}
	}
	return &Refusal{Command: name, Class: NotListed, Reason: "it is not on the allow-list of raw QMP commands (vmsup qmp --help, docs/qmp-policy.md)"}
}
