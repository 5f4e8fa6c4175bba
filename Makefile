# vmsup: `make demo` boots a real VM from examples/demo.toml; `make test` runs every test.
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: build demo test guest vet bench clean
build:
	$(GO) build -o bin/vmsup ./cmd/vmsup

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

guest:
	bash scripts/build-guest.sh

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
