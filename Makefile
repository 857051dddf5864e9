# scorer — build, test and run. Everything a fresh machine needs is fetched here.
SHELL := /bin/bash
.DEFAULT_GOAL := build

DEPS        := .deps
# ORT_VERSION/ORT_SHA256 are the core row of ORT_PINS (deploy tests keep them equal): one
# CUDA-capable ONNX Runtime core that every test runs and both images ship.
ORT_PINS    := deploy/ort/pins.txt
ORT_VERSION := 1.29.0
ORT_SHA256  := 89688f5cf51c7e31befbb7b9101bc027799009b18d1baa9a5b1146a72e69538d
ORT_LIB     := $(abspath $(DEPS)/ort-$(ORT_VERSION)/libonnxruntime.so.1)
ORT_CUDA_DIR := $(abspath $(DEPS)/ort-cuda)
export ORT_CUDA_DIR
SHARED      ?= $(abspath ../shared)
MODEL_DIR   ?= $(SHARED)/models/nli-unigram-small
TRANSCRIPTS ?= $(SHARED)/data/transcripts/transcripts.jsonl
BIN         := bin/scorer
GO          ?= go
export CGO_ENABLED := 1
export ORT_LIB
export MODEL_DIR

GO_SOURCES := $(shell find . -name '*.go' -not -path './.deps/*' 2>/dev/null) go.mod go.sum

HELM_VERSION := v3.22.0
HELM        := $(abspath $(DEPS)/bin/helm)
export HELM
FUZZTIME    ?= 15s

.PHONY: build ort cuda-ort kcat helm promtool test test-short fuzz vet fmt lint run bench rawloop golden image image-cuda image-test clean

build: $(BIN) ort

$(BIN): $(GO_SOURCES)
	$(GO) build -o $(BIN) ./cmd/scorer

# ONNX Runtime's core library ships inside the onnxruntime-node npm package; we take only the .so.
ort: $(ORT_LIB)
$(ORT_LIB):
	./scripts/fetch-ort.sh $(ORT_VERSION) $(ORT_SHA256) $(ORT_LIB)

# The CUDA image's exact /opt/onnxruntime/lib (same names, same bytes): the core plus the CUDA
# provider libraries of the same release, all from ORT_PINS. Built beside and renamed, so the
# directory never holds a partial or stale set; the stamp beside it (not in it: the directory holds
# only the image's files) records which pins it came from.
cuda-ort: $(ORT_CUDA_DIR).pins
$(ORT_CUDA_DIR).pins: $(ORT_PINS)
	rm -rf $(ORT_CUDA_DIR).tmp
	./scripts/fetch-ort.sh --pins $(ORT_PINS) cuda $(ORT_CUDA_DIR).tmp
	rm -rf $(ORT_CUDA_DIR) && mv $(ORT_CUDA_DIR).tmp $(ORT_CUDA_DIR)
	cp $(ORT_PINS) $@

# kcat is the independent Kafka client the interop tests talk to: Debian's
# package, installed system-wide when we may, else unpacked under .deps/kcat.
KCAT_DIR := $(abspath $(DEPS)/kcat)
PROMTOOL_DIR := $(abspath $(DEPS)/promtool)
export PATH := $(PROMTOOL_DIR)/bin:$(KCAT_DIR)/bin:$(PATH)
kcat:
	@./scripts/install-kcat.sh $(KCAT_DIR)

# promtool checks and unit-tests the alerting rules in deploy's tests: from
# Debian's prometheus package, unpacked under .deps/promtool unless on PATH.
promtool:
	@./scripts/install-promtool.sh $(PROMTOOL_DIR)

# helm renders the chart in deploy's tests; Debian has no package, so it is
# built from its Go module (a few minutes, once).
helm: $(HELM)
$(HELM):
	GOBIN=$(abspath $(DEPS)/bin) ./scripts/retry.sh 3 $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

vet:
	$(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: fmt vet

test: ort cuda-ort kcat helm promtool lint
	$(GO) test -race -count=1 -timeout 45m ./...
	$(MAKE) fuzz
	$(MAKE) image-test

# A short run of every fuzz target; seed corpora live in testdata/fuzz.
fuzz: ort
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $(FUZZTIME) ./schema
	$(GO) test -run '^$$' -fuzz '^FuzzPythonList$$' -fuzztime $(FUZZTIME) ./schema
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(FUZZTIME) ./model/tokenizer

test-short: ort
	$(GO) test -short -count=1 ./...

run: build
	./scripts/run-demo.sh

# Benchmarks print their tables and write docs/benchmarks.json (and the whole-process table into
# docs/benchmarks.md); never part of `make test`. About 15 minutes for the small models on 2 quiet cores,
# plus about 25 for the production-size DeBERTa-v3 stand-in (built under .deps on first use; BENCH_FLAGS="--skip
# large,production" leaves it out). BENCH_FLAGS adds flags, e.g. BENCH_FLAGS="--transcripts-limit 40 --skip memory";
# see `bin/scorer bench -h`.
DEBERTA_DIR := $(abspath $(DEPS)/deberta-v3-large-standin)
bench: build rawloop $(DEBERTA_DIR)/onnx/model_quantized.onnx
	$(BIN) bench --model-dirs "$(SHARED)/models/nli-unigram-small,$(SHARED)/models/nli-wordpiece-small" --transcripts $(TRANSCRIPTS) --out docs/benchmarks.json --md docs/benchmarks.md --cpuprofile bin/bench-cpu.prof --large-model $(DEBERTA_DIR) --production-model $(DEBERTA_DIR) $(BENCH_FLAGS)

$(DEBERTA_DIR)/onnx/model_quantized.onnx:
	./scripts/make-deberta.sh $(SHARED) $(DEBERTA_DIR)

# The independent raw loop `make bench` compares `scorer score` with (HF tokenizers + onnxruntime-node).
rawloop:
	cd tools/rawloop && ./../../scripts/retry.sh 3 npm install --ignore-scripts --no-audit --no-fund >/dev/null

# Regenerates the golden token IDs and scores from the Hugging Face reference implementations (npm).
golden:
	cd tools/golden && npm install --ignore-scripts --no-audit --no-fund >/dev/null && node generate.mjs

# Container images: docker when a Docker engine answers, else podman (see docs/operating.md, "Images").
# LOCAL_BASES=1 (podman) builds FROM base images made on this machine, for hosts that reach no registry.
IMAGE ?= scorer:dev
image:
	./scripts/image-build.sh deploy/docker/Dockerfile $(IMAGE)
image-cuda:
	./scripts/image-build.sh deploy/docker/Dockerfile.cuda $(IMAGE)-cuda

# Builds the CPU image with podman from local bases and runs it as users do (deploy's TestImage), then
# checks the CUDA Dockerfile's ORT files; skipped with a message only where podman cannot run at all.
image-test: kcat
	./scripts/image-test.sh

clean:
	rm -rf bin $(DEPS)
