# scorer — build, test and run. Everything a fresh machine needs is fetched here.
SHELL := /bin/bash
.DEFAULT_GOAL := build

DEPS        := .deps
# ORT_PINS is the one list of ONNX Runtime files: the "cpu" set (the core every build, test and
# the CPU image run: the fastest on CPU) and the "cuda" set (the CUDA image's core and providers,
# one older release). ORT_VERSION is the cpu row's version.
ORT_PINS    := deploy/ort/pins.txt
ORT_VERSION := $(shell awk '$$1 == "cpu" { sub(/.*@/, "", $$2); print $$2 }' $(ORT_PINS))
ifeq ($(ORT_VERSION),)
$(error $(ORT_PINS) has no cpu row)
endif
ORT_LIB     := $(abspath $(DEPS)/ort-$(ORT_VERSION)/libonnxruntime.so.1)
ORT_CUDA_DIR := $(abspath $(DEPS)/ort-cuda)
export ORT_CUDA_DIR
SHARED      ?= $(abspath ../shared)
MODEL_DIR   ?= $(SHARED)/models/nli-unigram-small
TRANSCRIPTS ?= $(SHARED)/data/transcripts/transcripts.jsonl
BIN         := bin/scorer
GO          ?= go
export CGO_ENABLED := 1
# go-nvml's nvml.h marks functions CUDA 13 deprecated, and cgo's generated wrappers reference every
# one: gcc prints ~145 lines of warnings about code we do not call. Go's own default plus the one
# switch that silences them; a CGO_CFLAGS from the environment wins.
CGO_CFLAGS  ?= -O2 -g -Wno-deprecated-declarations
export CGO_CFLAGS
export ORT_LIB
export MODEL_DIR

GO_SOURCES := $(shell find . -name '*.go' -not -path './.deps/*' 2>/dev/null) go.mod go.sum

HELM_VERSION := v3.22.0
HELM        := $(abspath $(DEPS)/bin/helm)
export HELM
# staticcheck 2026.2.2 (module honnef.co/go/tools v0.8.2): the release that knows Go 1.26.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(abspath $(DEPS)/bin/staticcheck)
FUZZTIME    ?= 15s

.PHONY: build ort cuda-ort kcat helm promtool duckdb staticcheck test test-short test-times fuzz soak vet fmt lint docs run bench bench-profile rawloop golden tiny-models image image-cuda image-test dist gpu-proof onnxpb clean

build: $(BIN) ort

$(BIN): $(GO_SOURCES)
	$(GO) build -o $(BIN) ./cmd/scorer

# ONNX Runtime's core library ships inside the onnxruntime-node npm package; we take only the .so.
ort: $(ORT_LIB)
$(ORT_LIB):
	./scripts/fetch-ort.sh --pins $(ORT_PINS) cpu $(dir $(ORT_LIB))

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

# The portable GPU bundle for hosts without containers (deploy/dist/README.md): the binary, the CUDA
# set of `make cuda-ort` (one ORT release: core + CUDA providers), the launcher that finds CUDA 13 /
# cuDNN 9 on the host or in a Python environment's NVIDIA wheels, a README and SHA256SUMS, written as
# zstd by Go (klauspost/compress), so no zstd tool is needed to build it. deploy's TestBundle builds
# one, unpacks it and runs its doctor in `make test`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
dist: $(BIN) cuda-ort
	$(GO) run ./tools/dist -version $(VERSION) -binary $(BIN) -ort $(ORT_CUDA_DIR) -out dist

# The GPU evidence in one command on a GPU host (docs/gpu.md, "make gpu-proof"): doctor, CUDA-vs-CPU
# parity on real transcripts, fp32/fp16 throughput and memory on a production-size DeBERTa, the memory
# model against measured peaks, two scorers sharing the GPU. Without a GPU it stops at once with the
# doctor's cause. GPU_PROOF_FLAGS adds flags (scripts/gpu-proof.sh -h).
gpu-proof: $(BIN) cuda-ort
	$(GO) build -o bin/onnx-fp16 ./tools/onnx-fp16
	./scripts/gpu-proof.sh $(GPU_PROOF_FLAGS)

# Regenerates model/onnxpb from onnx.proto (protoc + protoc-gen-go); the output is committed.
onnxpb:
	./scripts/gen-onnxpb.sh

# kcat is the independent Kafka client the interop tests talk to: Debian's
# package, installed system-wide when we may, else unpacked under .deps/kcat.
KCAT_DIR := $(abspath $(DEPS)/kcat)
PROMTOOL_DIR := $(abspath $(DEPS)/promtool)
export PATH := $(PROMTOOL_DIR)/bin:$(KCAT_DIR)/bin:$(PATH)
kcat:
	@./scripts/install-kcat.sh $(KCAT_DIR)

# Apache Kafka's broker for the real-cluster tests (scripts/kafka.sh, internal/kafkatest): the jars of
# deploy/kafka/pom.xml for KAFKA_VERSION, fetched once into .deps/kafka-VERSION/libs through the Maven
# repository .deps/m2 and checked against deploy/kafka/VERSION.sha256. kcat reads the clusters' metadata.
KAFKA_VERSION ?= 4.4.0
.PHONY: kafka
kafka: kcat $(DEPS)/kafka-$(KAFKA_VERSION)/pins.sha256
$(DEPS)/kafka-$(KAFKA_VERSION)/pins.sha256: deploy/kafka/$(KAFKA_VERSION).sha256 deploy/kafka/pom.xml
	KAFKA_VERSION=$(KAFKA_VERSION) ./scripts/kafka.sh fetch

# promtool checks and unit-tests the alerting rules in deploy's tests: from
# Debian's prometheus package, unpacked under .deps/promtool unless on PATH.
promtool:
	@./scripts/install-promtool.sh $(PROMTOOL_DIR)

# helm renders the chart in deploy's tests; Debian has no package, so it is
# built from its Go module (a few minutes, once).
helm: $(HELM)
$(HELM):
	GOBIN=$(abspath $(DEPS)/bin) ./scripts/retry.sh 3 $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# DuckDB (npm, pinned by tools/duckdb/package-lock.json) is the independent engine the Parquet
# tests of `scorer score` write their input tables with and read the scorer's output back with.
DUCKDB_DIR := tools/duckdb
duckdb: $(DUCKDB_DIR)/node_modules/.package-lock.json
$(DUCKDB_DIR)/node_modules/.package-lock.json: $(DUCKDB_DIR)/package-lock.json $(DUCKDB_DIR)/package.json
	cd $(DUCKDB_DIR) && ../../scripts/retry.sh 3 npm ci --ignore-scripts --no-audit --no-fund >/dev/null

# staticcheck runs in `make lint`; built from its Go module (pinned above) into .deps/bin, as helm is.
staticcheck: $(STATICCHECK)
$(STATICCHECK):
	GOBIN=$(abspath $(DEPS)/bin) ./scripts/retry.sh 3 $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

vet:
	$(GO) vet ./...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: fmt vet $(STATICCHECK)
	$(STATICCHECK) ./...

# docs/configuration.md and README.md's usage section are written from the code (internal/config's
# Config and each subcommand's cli.Spec); cmd/scorer's tests fail when either is stale.
docs:
	$(GO) test -count=1 -run '^TestDocs' ./cmd/scorer -update

# The CUDA image's core is another ONNX Runtime release than the cpu core every other test runs; the
# model package's tests of what differs between two releases run once more on it, so both shipped
# cores are checked: loading the library and its providers, scores against the golden files on every
# shared model, the relative-attention rewrite's contrib ops, external data, run cancellation and the
# arena. The rest of the package (our Go code around ORT) gains nothing from a second core.
ORT_CORE_TESTS := ^(TestInitRuntimeErrors|TestProbeRuntime|TestGoldenScores|TestRelAttentionHFLogits|TestSymlinkedModelFolder|TestSessionCancel|TestReleaseArenaAndMemPattern|ExampleLoad)$$
#
# The image is built in the background beside the Go tests (minutes of compiling and unpacking, which
# fill the time the drills spend waiting and the end of the run, when one package is left); its log
# is printed if the build fails. image-test then runs it with the machine to itself, the build a cache hit.
# After them, the whole-corpus tokenizer check (no -race: 2 minutes of CPU) and the CUDA core's tests
# run beside the soak, which spends its two minutes mostly waiting out its faults; their output follows
# the soak's verdict.
# Test binaries run four at a time, not GOMAXPROCS (2 here): the broker and consumer tests spend most
# of their wall time waiting on timeouts and heartbeats, and a waiting package should not hold one of two
# slots (go test -short ./...: 121 s at -p 2, 96 s at -p 4 on 2 cores; docs/testing.md).
TEST_P ?= 4
test: ort cuda-ort kcat kafka helm promtool duckdb lint
	mkdir -p bin; IMAGE_TEST_BUILD_ONLY=1 ./scripts/image-test.sh >bin/image-build.log 2>&1 & build=$$!; \
	status=0; \
	$(GO) test -race -count=1 -p $(TEST_P) -timeout 45m ./... || status=$$?; \
	if [ $$status -eq 0 ]; then \
		{ $(GO) test -count=1 -run '^TestHFCorpus$$' ./model/tokenizer && \
		  ORT_LIB=$(ORT_CUDA_DIR)/libonnxruntime.so.1 $(GO) test -race -count=1 -timeout 20m -run '$(ORT_CORE_TESTS)' ./model; } >bin/test-after.log 2>&1 & after=$$!; \
		$(MAKE) soak SOAK_MINUTES=2 SOAK_SEED=20261129 || status=$$?; \
		wait $$after || status=1; cat bin/test-after.log; \
	fi; \
	if [ $$status -eq 0 ]; then $(MAKE) fuzz || status=$$?; fi; \
	if ! wait $$build; then echo "image build failed (bin/image-build.log):"; tail -n 40 bin/image-build.log; status=1; fi; \
	if [ $$status -eq 0 ]; then $(MAKE) image-test || status=$$?; fi; \
	exit $$status

# The randomized fault soak (docs/reliability.md, "Randomized fault soak"): the broker with a data dir
# behind internal/faultproxy, four `scorer run` processes of $(BIN), a producer writing transcripts in
# several versions per call_id, and for SOAK_MINUTES random faults (kills, joins and leaves, broker
# restarts, refused commits, a moved log start, the input topic re-created, delay, resets, a frozen
# network, poison); then the group catches up and the checker reads everything back. The last line
# is the verdict; it exits non-zero when a bound is broken. SOAK_SEED=0 draws a seed (printed first);
# any other replays that one's draws. `make test` runs two minutes of a fixed seed after the Go tests.
SOAK_MINUTES ?= 10
SOAK_SEED    ?= 0
soak: $(BIN) ort
	$(GO) build -o bin/soak ./tools/soak
	bin/soak -minutes $(SOAK_MINUTES) -seed $(SOAK_SEED) -scorer $(BIN) -model-dir $(SHARED)/models/nli-unigram-small -transcripts $(TRANSCRIPTS)

# A short run of every fuzz target; seed corpora live in testdata/fuzz.
fuzz: ort
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $(FUZZTIME) ./schema
	$(GO) test -run '^$$' -fuzz '^FuzzPythonList$$' -fuzztime $(FUZZTIME) ./schema
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(FUZZTIME) ./model/tokenizer

# The inner loop (docs/testing.md): every package's unit behaviour, the drills skipped. It needs ONNX
# Runtime and DuckDB (internal/offline's Parquet decoding); deploy's checks skip, saying so, without
# helm or promtool.
test-short: ort duckdb
	$(GO) test -short -count=1 -p $(TEST_P) ./...

# Where the suite's time goes (scripts/test-times.sh): each package's wall and CPU time and the 20
# slowest tests of `go test -race ./...`, or of TEST_ARGS (TEST_ARGS='-short ./...', TEST_ARGS='-race ./model').
TEST_ARGS ?= -race -p $(TEST_P) -timeout 45m ./...
test-times: ort
	./scripts/test-times.sh $(TEST_ARGS)

run: build
	./scripts/run-demo.sh

# Benchmarks print their tables, write docs/benchmarks.json and, into docs/benchmarks.md, each section's
# table headed by its run's date, CPU, cores, ONNX Runtime, models and how busy the machine was; never part
# of `make test`. About 15 minutes for the small models on 2 quiet cores, plus about 25 for the
# production-size DeBERTa-v3 stand-in (built under .deps on first use; BENCH_FLAGS="--skip large,production"
# leaves it out). BENCH_FLAGS adds flags; a run of some sections names its own JSON, so the blocks of the
# others keep theirs: BENCH_FLAGS="--skip … --out docs/benchmarks-NAME.json". See `bin/scorer bench -h`.
DEBERTA_DIR := $(abspath $(DEPS)/deberta-v3-large-standin)
bench: build rawloop $(DEBERTA_DIR)/onnx/model_quantized.onnx
	$(BIN) bench --model-dirs "$(SHARED)/models/nli-unigram-small,$(SHARED)/models/nli-wordpiece-small,testdata/models/nli-roberta-bpe-tiny" --transcripts $(TRANSCRIPTS) --out docs/benchmarks.json --md docs/benchmarks.md --cpuprofile bin/bench-cpu.prof --large-model $(DEBERTA_DIR) --production-model $(DEBERTA_DIR) $(BENCH_FLAGS)
	$(MAKE) bench-profile

# ONNX Runtime's per-node profile of the production-size stand-in (fp32 and its fp16 twin), with the
# relative-attention rewrite off and on: time and output bytes by op type and over the relative-position
# path, and the op types of ORT's optimised graph (what its fusions leave unfused), first counted once
# per attention rewrite (ATTENTION_REWRITES), each added to those before it. Prints the tables and keeps
# them in bin/profile.txt (profiles and optimised graphs under bin/profile); docs/benchmarks.md, "Where
# the time goes", reads them. About 12 minutes on 2 cores; PROFILE_FLAGS adds flags (on a GPU host with
# ONNX Runtime's CUDA set as ORT_LIB: PROFILE_FLAGS=-device cuda).
bench-profile: $(DEBERTA_DIR)/onnx/model_quantized.onnx
	$(GO) run ./tools/ortprofile -model $(DEBERTA_DIR) -rows 4 -lens 48,512 -runs 2 -fp16 -out bin/profile $(PROFILE_FLAGS) | tee bin/profile.txt

$(DEBERTA_DIR)/onnx/model_quantized.onnx:
	./scripts/make-deberta.sh $(SHARED) $(DEBERTA_DIR)

# The independent raw loop `make bench` compares `scorer score` with (HF tokenizers + onnxruntime-node).
RAWLOOP_DIR := tools/rawloop
rawloop: $(RAWLOOP_DIR)/node_modules/.package-lock.json
$(RAWLOOP_DIR)/node_modules/.package-lock.json: $(RAWLOOP_DIR)/package-lock.json $(RAWLOOP_DIR)/package.json
	cd $(RAWLOOP_DIR) && ../../scripts/retry.sh 3 npm ci --ignore-scripts --no-audit --no-fund >/dev/null

# Regenerates the golden token IDs and scores from the Hugging Face reference implementations (npm),
# the tokenizer variants (testdata/tokenizers) and the whole-corpus id digests (model/testdata/golden/
# corpus-digest.json over every sentence: about an hour and a half of CPU, see tools/golden/README.md).
golden:
	cd tools/golden && npm install --ignore-scripts --no-audit --no-fund >/dev/null && node generate.mjs && node variants.mjs && node corpus.mjs

# Regenerates testdata/models/nli-{roberta,bart}-bpe-tiny: the byte-level BPE tokenizer, the random-weight
# RoBERTa and BART classifiers and their torch references (tools/tiny-models; torch 1.13 and onnx 1.12 under
# /usr/bin/python3, HF tokenizers and onnxruntime-node from npm). Not part of `make test`: the folders are
# committed, and the same inputs give the same bytes.
TINY_NODE := $(DEPS)/tiny-models
tiny-models:
	mkdir -p $(TINY_NODE)
	scripts/retry.sh 3 npm install --prefix $(TINY_NODE) --ignore-scripts --no-audit --no-fund --no-save tokenizers@0.23.2 onnxruntime-node@1.30.0 >/dev/null
	/usr/bin/python3 tools/tiny-models/train_bpe.py $(TRANSCRIPTS) roberta=testdata/models/nli-roberta-bpe-tiny bart=testdata/models/nli-bart-bpe-tiny
	HF_TOKENIZERS=$(abspath $(TINY_NODE))/node_modules/tokenizers node tools/tiny-models/encode_pairs.mjs testdata/models/nli-roberta-bpe-tiny/tokenizer.json $(TRANSCRIPTS) > $(TINY_NODE)/pairs.json
	/usr/bin/python3 tools/tiny-models/make_models.py $(TINY_NODE)/pairs.json testdata/models
	ORT_NODE=$(abspath $(TINY_NODE))/node_modules/onnxruntime-node node tools/tiny-models/check_onnx.mjs testdata/models/nli-roberta-bpe-tiny testdata/models/nli-bart-bpe-tiny

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
	rm -rf bin dist $(DEPS)
