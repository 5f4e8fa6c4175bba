package main

import "github.com/spf13/cobra"

// examples are the commands' help examples, kept together so they read as
// one tour of the CLI.
var examples = map[string]string{
	"up":               "  vmsup up web.toml db.toml\n  vmsup up --restart-changed web.toml   # apply an edited file by a restart\n  vmsup up --from-snapshot tmpl:warm web2   # a clone resumed from a memory snapshot",
	"ls":               "  vmsup ls\n  vmsup ls --json",
	"network":          "  vmsup network create lab.toml\n  vmsup network ls\n  vmsup network rm lab",
	"events":           "  vmsup events web                # what happened, also while no vmsup ran\n  vmsup events -f --since 1h      # every VM, then new events as they come\n  vmsup events --json web",
	"stats":            "  vmsup stats web\n  vmsup stats --json",
	"top":              "  vmsup top\n  vmsup top --every 5s web db",
	"metrics":          "  vmsup metrics | promtool check metrics\n  vmsup metrics --install --listen 127.0.0.1:9475   # scrape http://127.0.0.1:9475/metrics",
	"plan":             "  vmsup plan web.toml\n  vmsup plan --json web.toml db.toml",
	"apply":            "  vmsup apply web.toml                    # live changes now, boot settings at the next reboot\n  vmsup apply --restart web.toml          # and a health-gated restart for the rest\n  vmsup apply --at-next-reboot web.toml   # or the rest when the guest reboots",
	"status":           "  vmsup status web\n  vmsup status --json web.toml",
	"pause":            "  vmsup pause web",
	"resume":           "  vmsup resume web",
	"console":          "  vmsup console web          # Ctrl-] to leave\n  vmsup console --web win11  # its screen in a browser: prints http://127.0.0.1:PORT/TOKEN/vnc.html?...",
	"vnc":              "  vmsup vnc win11            # prints vnc://127.0.0.1:PORT for one VNC client\n  vncviewer 127.0.0.1::PORT",
	"screenshot":       "  vmsup screenshot win11 win11.png",
	"argv":             "  vmsup argv web.toml        # the QEMU command line, one argument per line",
	"qmp":              "  vmsup qmp web '{\"execute\":\"query-status\"}'",
	"apparmor-profile": "  vmsup apparmor-profile web.toml",
	"enable":           "  vmsup enable --now web.toml",
	"disable":          "  vmsup disable web",
	"autostart":        "  vmsup autostart            # what the boot unit runs",
	"host":             "  vmsup host\n  vmsup host --json --refresh",
	"migrate":          "  vmsup migrate --local web\n  vmsup migrate --to host-b web",
	"move":             "  vmsup down web && vmsup move web --to host-b   # a shut-off VM and its local disks\n  vmsup move web --to host-b --keep-source-disks --bandwidth 200M",
	"ping":             "  vmsup ping web",
	"rm":               "  vmsup rm web               # a shut-off VM's state and records",
	"set":              "  vmsup set web --cpus 4 --memory 2G\n  vmsup set web --cpu-quota 150",
	"disk":             "  vmsup disk attach web --file /srv/data.qcow2\n  vmsup disk ls web\n  vmsup disk move web data --to /var/lib/vmsup/images/data.qcow2\n  vmsup disk detach web data",
	"nic":              "  vmsup nic attach web lan1 --type bridge --bridge br0\n  vmsup nic ls web\n  vmsup nic detach web lan1",
	"hostdev":          "  vmsup hostdev attach web 0000:01:00.0\n  vmsup hostdev detach web 0000:01:00.0",
	"snapshot":         "  vmsup snapshot create web before-upgrade\n  vmsup snapshot create web warm --memory\n  vmsup snapshot ls web\n  vmsup snapshot revert --force web before-upgrade\n  vmsup snapshot rm web before-upgrade",
	"backup":           "  vmsup backup web --to /srv/backup/web                 # a full point\n  vmsup backup web --to /srv/backup/web --incremental   # what changed since",
	"restore":          "  vmsup restore /srv/backup/web --to /srv/web-data.qcow2\n  vmsup restore /srv/backup/web --disk data --point 2 --format raw --to /tmp/data.raw",
	"version":          "  vmsup version\n  vmsup --version",
	"completion":       "  source <(vmsup completion bash)",
	"fleet": "  export VMSUP_ETCD_ENDPOINTS=https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379\n" +
		"  vmsup fleet apply web.toml db.toml   # stored in etcd; the scheduler places them\n  vmsup fleet ls\n  vmsup fleet hosts\n" +
		"  vmsup fleet drain host-b             # live-migrates its VMs away\n  vmsup fleet uncordon host-b\n  vmsup fleet rm web",
	"api":       "  vmsup api install --url https://vmhost:8443          # units, CA and server certificate\n  vmsup api cert ci --role operator --vms 'web*' > ci.bundle\n  vmsup remote add vmhost --bundle ci.bundle           # on the client; then: vmsup --remote vmhost ls",
	"remote":    "  vmsup remote add vmhost --bundle ci.bundle\n  vmsup remote ls\n  vmsup --remote vmhost status web\n  vmsup remote rm vmhost",
	"api serve": "  vmsup api serve   # what vmsup-api.service runs (its configuration: ROOT/remote/remote.toml)",
	"api units": "  vmsup api units --listen 0.0.0.0:8443 --socket /run/vmsup/api.sock",
	"agent":     "  vmsup agent --host host-a --labels zone=a --migration-address 10.0.0.11 --migration-port 7788   # as a systemd service",
}

func addExamples(root *cobra.Command) {
	for _, c := range root.Commands() {
		if ex, ok := examples[c.Name()]; ok && c.Example == "" {
			c.Example = ex
		}
	}
}
