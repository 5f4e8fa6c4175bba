# vmsup: `make demo` boots a real VM from examples/demo.toml; `make test` runs every test;
# `make bench` measures vmsup against raw QEMU and libvirt.
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build demo test guest vet bench clean man deb
build:
	$(GO) build -o bin/vmsup ./cmd/vmsup

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

guest:
	bash scripts/build-guest.sh

# bench: vmsup vs raw QEMU vs libvirt, side by side (root; ~10-15 min); results in bench/results/.
# BENCH_FLAGS passes options through, e.g. BENCH_FLAGS="-only start,qmp -reps 5".
bench:
	bash scripts/install-bench-deps.sh
	$(GO) build -o bin/vmsup ./cmd/vmsup
	$(GO) build -o bin/vmsup-bench ./cmd/vmsup-bench
	./bin/vmsup-bench -vmsup bin/vmsup -out bench/results $(BENCH_FLAGS)

# man: the man pages of every command, generated from the command tree, into man/.
man: build
	rm -rf man && mkdir -p man && ./bin/vmsup gen-man man

# deb: the Debian package, offline (dpkg-deb), into bin/vmsup_VERSION_amd64.deb.
deb:
	bash scripts/build-deb.sh bin

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
