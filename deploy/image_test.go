package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// imageShutdownTimeout is the SHUTDOWN_TIMEOUT the container runs with; SIGTERM must end it, exit 0,
// within this.
const imageShutdownTimeout = 20 * time.Second

// podman runs podman with the runtime scripts/podman-env.sh chose ($PODMAN_RUNTIME; CONTAINERS_CONF
// comes through the environment).
func podman(ctx context.Context, args ...string) *exec.Cmd {
	if rt := os.Getenv("PODMAN_RUNTIME"); rt != "" {
		args = append([]string{"--runtime", rt}, args...)
	}
	return exec.CommandContext(ctx, "podman", args...)
}

// scorerBin is ./cmd/scorer built once for the package's tests (the image
// test's host-side broker and producer, the bundle, gpu-proof), in binDir,
// which TestMain removes.
var (
	binDir    string
	scorerBin = sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp("", "deploy-scorer-")
		if err != nil {
			return "", err
		}
		binDir = dir
		bin := filepath.Join(dir, "scorer")
		build := exec.Command("go", "build", "-o", bin, "../cmd/scorer")
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build: %v\n%s", err, out)
		}
		return bin, nil
	})
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildScorer returns the scorer binary, built on first use; tests must
// not change it.
func buildScorer(t *testing.T) string {
	t.Helper()
	bin, err := scorerBin()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestImage runs the CPU image that `make image-test` built (SCORER_IMAGE) as a user runs it: uid
// 65532, read-only root file system with only /tmp writable, no capabilities, the real model mounted
// read-only at /models, the image's own ORT_LIB/MODEL_DIR/DEVICE defaults, against `scorer broker` on
// the host. Real transcripts and one malformed record are produced with kcat; every transcript must
// come back scored, the bad record dead-lettered, and SIGTERM must end the container with exit 0
// within SHUTDOWN_TIMEOUT and every input offset committed.
func TestImage(t *testing.T) {
	image := os.Getenv("SCORER_IMAGE")
	if image == "" {
		t.Skip("SCORER_IMAGE is unset: `make image-test` builds the image with podman and runs this test on it")
	}
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat not found on PATH: `make kcat` installs it")
	}
	modelDir := testenv.ScorerModelDir(t)
	bin := buildScorer(t)

	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	brokerAddr, metricsAddr := freeAddr(t), freeAddr(t)
	broker := exec.CommandContext(ctx, bin, "broker", "--addr", brokerAddr)
	var brokerLog bytes.Buffer
	broker.Stdout, broker.Stderr = &brokerLog, &brokerLog
	broker.WaitDelay = 5 * time.Second
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = broker.Process.Signal(os.Interrupt)
		_ = broker.Wait()
		if t.Failed() {
			t.Logf("broker log (tail):\n%s", tail(brokerLog.Bytes(), 2000))
		}
	})

	name := fmt.Sprintf("scorer-image-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	run := podman(ctx, "run", "--detach", "--name", name,
		"--network", "host",
		"--user", "65532:65532",
		"--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=64m",
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--volume", modelDir+":/models:ro",
		"--env", "KAFKA_BROKERS="+brokerAddr,
		"--env", "METRICS_ADDR="+metricsAddr,
		"--env", "SHUTDOWN_TIMEOUT="+imageShutdownTimeout.String(),
		"--env", "BATCH_MAX_WAIT=50ms",
		image)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := podman(context.Background(), "logs", "--tail", "40", name).CombinedOutput()
			t.Logf("container log (tail):\n%s", out)
		}
		_ = podman(context.Background(), "rm", "--force", "--time", "0", name).Run()
	})

	base := "http://" + metricsAddr
	waitFor(ctx, t, "/readyz 200 from the container", func() (bool, string) {
		code, body := httpGet(ctx, base+"/readyz")
		if code != http.StatusOK {
			// A container that exited will never answer: fail now, not at the deadline.
			state, _ := podman(ctx, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).Output()
			if s := strings.TrimSpace(string(state)); !strings.HasPrefix(s, "running") && !strings.HasPrefix(s, "created") {
				t.Fatalf("the container is %q before it became ready", s)
			}
		}
		return code == http.StatusOK, body
	})

	// Images build from a copy without .git: the version comes from
	// image-build.sh's VERSION build argument, not "(devel)".
	t.Run("version", func(t *testing.T) {
		want := os.Getenv("SCORER_IMAGE_VERSION")
		if want == "" {
			t.Skip("SCORER_IMAGE_VERSION is unset: scripts/image-test.sh sets it to the version it built with")
		}
		_, body := httpGet(ctx, base+"/metrics")
		var line string
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, "scorer_build_info{") {
				line = strings.TrimSpace(l)
			}
		}
		if !strings.Contains(line, `version="`+want+`"`) {
			t.Errorf("scorer_build_info in the container: %q; want version=%q", line, want)
		}
	})

	t.Run("hardening", func(t *testing.T) {
		exec1 := func(args ...string) (string, error) {
			out, err := podman(ctx, append([]string{"exec", name}, args...)...).CombinedOutput()
			return strings.TrimSpace(string(out)), err
		}
		if out, err := exec1("id", "-u"); err != nil || out != strconv.Itoa(nonRootUID) {
			t.Errorf("id -u in the container = %q (%v), want %d", out, err, nonRootUID)
		}
		if out, err := exec1("sh", "-c", "echo x > /usr/local/bin/probe"); err == nil || !strings.Contains(out, "Read-only file system") {
			t.Errorf("writing under /usr/local/bin: err=%v %q, want a read-only file system error", err, out)
		}
		if out, err := exec1("sh", "-c", "echo x > /models/probe"); err == nil {
			t.Errorf("writing into the model mount succeeded (%q); it must be read-only", out)
		}
		if out, err := exec1("sh", "-c", "echo x > /tmp/probe && cat /tmp/probe"); err != nil || out != "x" {
			t.Errorf("/tmp is not writable: %v %q", err, out)
		}
	})

	// Three short real transcripts and one record that is not JSON.
	input := shortestLines(t, testenv.Transcripts(t), 3)
	want := map[string]bool{}
	for line := range bytes.Lines(input) {
		var ev struct {
			CallID string `json:"call_id"`
		}
		if err := json.Unmarshal(line, &ev); err != nil || ev.CallID == "" {
			t.Fatalf("corpus line without call_id: %v", err)
		}
		want[ev.CallID] = true
	}
	input = append(input, []byte("{this is not a transcript\n")...)
	produce := exec.CommandContext(ctx, kcat, "-P", "-b", brokerAddr, "-t", "transcripts",
		"-X", "message.max.bytes=67108864", "-z", "lz4")
	produce.Stdin = bytes.NewReader(input)
	if out, err := produce.CombinedOutput(); err != nil {
		t.Fatalf("kcat -P: %v\n%s", err, out)
	}

	consume := func(topic, format string) []string {
		out, err := exec.CommandContext(ctx, kcat, "-C", "-b", brokerAddr, "-t", topic, "-o", "beginning", "-e", "-q",
			"-X", "fetch.message.max.bytes=67108864", "-f", format).Output()
		if err != nil {
			t.Fatalf("kcat -C %s: %v", topic, err)
		}
		var recs []string
		for r := range strings.SplitSeq(string(out), "\x1e") {
			if strings.TrimSpace(r) != "" {
				recs = append(recs, r)
			}
		}
		return recs
	}
	var scored map[string]schema.ScoredTranscript
	waitFor(ctx, t, "every transcript scored on transcripts.scored", func() (bool, string) {
		scored = map[string]schema.ScoredTranscript{}
		for _, r := range consume("transcripts.scored", "%s\x1e") {
			var st schema.ScoredTranscript
			if err := json.Unmarshal([]byte(r), &st); err != nil {
				t.Fatalf("a result that is not a ScoredTranscript: %v: %.200s", err, r)
			}
			scored[st.CallID] = st
		}
		return len(scored) >= len(want), fmt.Sprintf("%d of %d scored", len(scored), len(want))
	})
	for id := range want {
		st, ok := scored[id]
		if !ok {
			t.Errorf("call %s was not scored", id)
			continue
		}
		if len(st.Labels) == 0 || len(st.Sections) == 0 || st.Model.Name == "" {
			t.Errorf("call %s: result without labels, sections or model: %+v", id, st)
		}
		for sec, sr := range st.Sections {
			for label, lr := range sr.Results {
				if len(lr.Scores) != sr.Sentences {
					t.Errorf("call %s %s/%s: %d scores for %d sentences", id, sec, label, len(lr.Scores), sr.Sentences)
				}
				for _, s := range lr.Scores {
					if !(s >= 0 && s <= 1) {
						t.Errorf("call %s %s/%s: score %v outside [0,1]", id, sec, label, s)
					}
				}
			}
		}
	}
	waitFor(ctx, t, "the malformed record on transcripts.dlq", func() (bool, string) {
		recs := consume("transcripts.dlq", "%h\x1e")
		for _, h := range recs {
			if strings.Contains(h, schema.HeaderDLQReason+"=malformed_json") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d dead letters: %q", len(recs), recs)
	})

	// SIGTERM: the container must drain, commit and exit 0 within SHUTDOWN_TIMEOUT.
	start := time.Now()
	if out, err := podman(ctx, "kill", "--signal", "TERM", name).CombinedOutput(); err != nil {
		t.Fatalf("podman kill: %v\n%s", err, out)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, imageShutdownTimeout+15*time.Second)
	defer waitCancel()
	out, err := podman(waitCtx, "wait", name).Output()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("podman wait: %v (after %s)", err, took)
	}
	if code := strings.TrimSpace(string(out)); code != "0" {
		t.Errorf("container exited %s after SIGTERM, want 0", code)
	}
	if took > imageShutdownTimeout {
		t.Errorf("container took %s to exit after SIGTERM, more than SHUTDOWN_TIMEOUT %s", took, imageShutdownTimeout)
	}
	t.Logf("SIGTERM to exit: %s", took.Round(time.Millisecond))

	committed, ends := groupOffsets(ctx, t, brokerAddr, "scorer", "transcripts")
	for p, end := range ends {
		if end > 0 && committed[p] != end {
			t.Errorf("partition %d: committed offset %d, end %d: not everything was committed before exit", p, committed[p], end)
		}
	}
	t.Logf("committed %v, ends %v", committed, ends)
}

// groupOffsets returns the group's committed offset and the end offset of every partition of topic.
func groupOffsets(ctx context.Context, t *testing.T, broker, group, topic string) (committed, ends map[int]int64) {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil {
		t.Fatalf("metadata %s: %v %+v", topic, err, md)
	}
	var parts []int
	req := map[string][]kafka.OffsetRequest{}
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		req[topic] = append(req[topic], kafka.LastOffsetOf(p.ID))
	}
	lo, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: req})
	if err != nil {
		t.Fatalf("list offsets: %v", err)
	}
	ends = map[int]int64{}
	for _, p := range lo.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("list offsets %s/%d: %v", topic, p.Partition, p.Error)
		}
		ends[p.Partition] = p.LastOffset
	}
	of, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err == nil && of.Error != nil {
		err = of.Error
	}
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	committed = map[int]int64{}
	for _, p := range of.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset fetch %s/%d: %v", topic, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	return committed, ends
}

// TestMakefileOpsTargets keeps `make test` running the operations checks: promtool installed before
// the Go tests (which run the alert unit tests) and the image test after them, and `make image`
// going through the script that picks docker or podman.
func TestMakefileOpsTargets(t *testing.T) {
	data, err := os.ReadFile(makefile)
	if err != nil {
		t.Fatal(err)
	}
	recipes := map[string][]string{}
	prereqs := map[string][]string{}
	cur := ""
	for line := range strings.SplitSeq(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "\t") && cur != "":
			recipes[cur] = append(recipes[cur], strings.TrimSpace(line))
		case strings.Contains(line, ":") && !strings.HasPrefix(line, "#") && !strings.Contains(line, "=") && !strings.HasPrefix(line, "."):
			name, deps, _ := strings.Cut(line, ":")
			cur = strings.TrimSpace(name)
			prereqs[cur] = strings.Fields(deps)
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#"):
			cur = ""
		}
	}
	if !slices.Contains(prereqs["test"], "promtool") {
		t.Errorf("make test prerequisites %v lack promtool", prereqs["test"])
	}
	// Both shipped ORT cores pass the golden and fidelity tests: the cpu core in the main run,
	// the CUDA image's core in a second run of the model package's ORT-facing tests
	// (ORT_CORE_TESTS). The recipe is one shell command over several lines.
	test := strings.Join(recipes["test"], "\n")
	if !strings.Contains(test, "$(GO) test -race -count=1 -p $(TEST_P) -timeout 45m ./...") {
		t.Errorf("make test recipe %q does not run go test -race ./...", test)
	}
	if !slices.Contains(prereqs["test"], "cuda-ort") || !strings.Contains(test, "ORT_LIB=$(ORT_CUDA_DIR)/libonnxruntime.so.1 $(GO) test -race -count=1") ||
		!strings.Contains(test, "-run '$(ORT_CORE_TESTS)' ./model") {
		t.Errorf("make test (prerequisites %v, recipe %q) does not run the model package's tests on the CUDA image's core", prereqs["test"], test)
	}
	core := ""
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "ORT_CORE_TESTS := "); ok {
			core = v
		}
	}
	for _, name := range []string{"TestProbeRuntime", "TestGoldenScores", "TestRelAttentionHFLogits", "TestSymlinkedModelFolder"} {
		if !strings.Contains(core, "|"+name+"|") && !strings.Contains(core, "("+name+"|") {
			t.Errorf("ORT_CORE_TESTS %q lacks %s: the CUDA image's core must load, list providers, score the golden pairs, run the rewrite and read external data", core, name)
		}
	}
	if !strings.Contains(test, "$(MAKE) fuzz") || !strings.Contains(test, "$(MAKE) image-test") {
		t.Errorf("make test recipe %q does not run $(MAKE) fuzz and $(MAKE) image-test", test)
	}
	if !slices.Contains(recipes["image-test"], "./scripts/image-test.sh") {
		t.Errorf("make image-test recipe %q does not run scripts/image-test.sh", recipes["image-test"])
	}
	if !slices.Contains(recipes["image"], "./scripts/image-build.sh deploy/docker/Dockerfile $(IMAGE)") {
		t.Errorf("make image recipe %q does not build deploy/docker/Dockerfile through scripts/image-build.sh", recipes["image"])
	}
	if !slices.Contains(recipes["image-cuda"], "./scripts/image-build.sh deploy/docker/Dockerfile.cuda $(IMAGE)-cuda") {
		t.Errorf("make image-cuda recipe %q does not build deploy/docker/Dockerfile.cuda through scripts/image-build.sh", recipes["image-cuda"])
	}
}
