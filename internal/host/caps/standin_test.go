package caps

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The stand-in QEMU: this test binary, run with VMSUP_STANDIN_QEMU=MODE, in
// front of the real QEMU. Under "-accel kvm" it behaves like one kind of
// KVM host and otherwise runs the real QEMU under TCG, proxying its QMP
// (stdio) so that query-kvm says KVM is in use:
//
//	full     every CPU model starts
//	mask     -cpu host and max abort as on an AMD PVM host ("failed to set
//	         MSR 0x10a") unless arch-capabilities is off
//	abort    -cpu host and max abort whatever is masked
//	nokvm    KVM cannot be initialised at all
//	missing:CMD  like full, and the QMP schema lacks command CMD
//	hang     KVM never answers (a host whose /dev/kvm is not ready yet)
const standinEnv = "VMSUP_STANDIN_QEMU"

func TestMain(m *testing.M) {
	if os.Getenv(orphanEnv) != "" {
		os.Exit(orphanProbe())
	}
	if mode := os.Getenv(standinEnv); mode != "" {
		os.Exit(standin(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func standin(mode string, args []string) int {
	real := os.Getenv("VMSUP_STANDIN_REAL")
	if real == "" {
		real = "/usr/bin/qemu-system-x86_64"
	}
	kvm := false
	cpu := ""
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-accel":
			if args[i+1] == "kvm" {
				kvm = true
				args[i+1] = "tcg"
			}
		case "-cpu":
			cpu = args[i+1]
		}
	}
	model, _, _ := strings.Cut(cpu, ",")
	if kvm {
		passthrough := model == "host" || model == "max"
		switch {
		case mode == "hang":
			time.Sleep(time.Hour) // until the probe kills it
			return 1
		case mode == "nokvm":
			fmt.Fprintln(os.Stderr, "Could not access KVM kernel module: No such file or directory")
			fmt.Fprintln(os.Stderr, "qemu-system-x86_64: -accel kvm: failed to initialize kvm: No such file or directory")
			return 1
		case passthrough && (mode == "abort" || mode == "mask" && !strings.Contains(cpu, "arch-capabilities=off")):
			fmt.Fprintln(os.Stderr, "error: failed to set MSR 0x10a to 0x69")
			fmt.Fprintln(os.Stderr, "qemu-system-x86_64: ../../target/i386/kvm/kvm.c:2893: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.")
			// Die of SIGABRT as QEMU does (the Go runtime would dump
			// its stacks first).
			syscall.Exec("/bin/sh", []string{"sh", "-c", "kill -ABRT $$"}, nil)
			return 134
		}
		if model == "host" { // TCG has no "host": run its nearest
			for i := range args {
				if args[i] == cpu {
					args[i] = "max" + strings.TrimPrefix(cpu, "host")
				}
			}
		}
	}
	missing, _ := strings.CutPrefix(mode, "missing:")
	cmd := exec.Command(real, args...)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	write := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(v)
		w.Write(append(b, '\n'))
		w.Flush()
	}
	schemaIDs := map[string]bool{}
	var smu sync.Mutex
	go func() { // requests: answer the KVM ones here, pass the rest on
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var req struct {
				Execute string          `json:"execute"`
				ID      json.RawMessage `json:"id"`
			}
			json.Unmarshal(sc.Bytes(), &req)
			switch {
			case kvm && req.Execute == "query-kvm":
				write(map[string]any{"return": map[string]bool{"enabled": true, "present": true}, "id": req.ID})
				continue
			case kvm && req.Execute == "query-cpu-model-expansion":
				props := map[string]bool{"arch-capabilities": true, "pdcm": false, "pmu": true, "svm": true}
				write(map[string]any{"return": map[string]any{"model": map[string]any{"name": "host", "props": props}}, "id": req.ID})
				continue
			case req.Execute == "query-qmp-schema":
				smu.Lock()
				schemaIDs[string(req.ID)] = true
				smu.Unlock()
			}
			in.Write(append(sc.Bytes(), '\n'))
		}
		in.Close()
	}()
	dec := json.NewDecoder(out)
	for {
		var msg map[string]json.RawMessage
		if err := dec.Decode(&msg); err != nil {
			if err != io.EOF {
				fmt.Fprintln(os.Stderr, "stand-in:", err)
			}
			break
		}
		smu.Lock()
		isSchema := schemaIDs[string(msg["id"])]
		smu.Unlock()
		if isSchema && missing != "" {
			var entries []map[string]any
			json.Unmarshal(msg["return"], &entries)
			entries = slices.DeleteFunc(entries, func(e map[string]any) bool { return e["name"] == missing })
			msg["return"], _ = json.Marshal(entries)
		}
		write(msg)
	}
	if err := cmd.Wait(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}
