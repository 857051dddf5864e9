// The tests of package main are the system tests of the whole binary: they
// run the dispatcher in-process (runCLI, runInProcess) or build and exec
// the binary (scorerBinary) against the real model, ONNX Runtime, the
// in-memory broker and kcat: end-to-end, crash, rebalance, faults, poison,
// security, interop, stuck partitions, signals, demo and produce. The shared
// helpers are here and in reliability_helpers_test.go. Unit tests live beside
// their code in internal/service, internal/offline, internal/bench, ….
package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// binPath is the scorer binary built once for the tests that run it as its
// own process (crash drills, the broker process, kcat interop).
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func scorerBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "scorer-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "scorer")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func environ(m map[string]string) []string {
	out := os.Environ()
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// startBrokerProcess runs `scorer broker` as its own process on a free port.
func startBrokerProcess(t testing.TB, partitions int) string {
	t.Helper()
	return startBrokerProcessAt(t, "127.0.0.1:0", partitions)
}

// startBrokerProcessAt runs `scorer broker` on addr and returns the address
// it reports once it listens.
func startBrokerProcessAt(t testing.TB, addr string, partitions int) string {
	t.Helper()
	cmd := exec.Command(scorerBinary(t), "broker", "--addr", addr, "--partitions", fmt.Sprint(partitions), "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "broker listening on "); ok {
				listening <- a
			}
		}
	}()
	select {
	case a := <-listening:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("broker process did not report its address within 30s")
		return ""
	}
}

// scorerProcess is `scorer run` as its own process, its log kept for failure reports.
type scorerProcess struct {
	cmd *exec.Cmd
	log *testenv.LockedBuffer
}

func startScorerProcess(t testing.TB, env map[string]string, args ...string) *scorerProcess {
	t.Helper()
	cmd := exec.Command(scorerBinary(t), append([]string{"run"}, args...)...)
	cmd.Env = environ(env)
	p := &scorerProcess{cmd: cmd, log: &testenv.LockedBuffer{}}
	cmd.Stdout = p.log
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("scorer log (pid %d):\n%s", cmd.Process.Pid, testenv.Tail(p.log.String(), 4000))
		}
	})
	return p
}

// produceFile loads a JSONL file into topic the way `scorer produce` does.
func produceFile(t testing.TB, broker, topic, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := produce.NewInputWriter([]string{broker}, topic, nil)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := produce.ProduceLines(ctx, w, f, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// readTopic reads every partition of topic from the start until want
// records arrived or the deadline passed; it returns what it has.
func readTopic(t testing.TB, broker, topic string, want int, timeout time.Duration) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	var (
		mu   sync.Mutex
		msgs []kafka.Message
		wg   sync.WaitGroup
	)
	for _, p := range parts {
		wg.Add(1)
		go func(p kafka.Partition) {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p.ID, MaxBytes: 64 << 20, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				mu.Lock()
				done := len(msgs) >= want
				mu.Unlock()
				if done {
					cancel()
					return
				}
				m, err := r.ReadMessage(ctx)
				if err != nil {
					return
				}
				mu.Lock()
				msgs = append(msgs, m)
				mu.Unlock()
			}
		}(p)
	}
	wg.Wait()
	return msgs
}

// decodeScored parses output values in either format.
func decodeScored(t testing.TB, msgs []kafka.Message) []schema.ScoredTranscript {
	t.Helper()
	out := make([]schema.ScoredTranscript, 0, len(msgs))
	for _, m := range msgs {
		var st schema.ScoredTranscript
		if err := produce.DecodeOutput(m.Value, &st); err != nil {
			t.Fatalf("output record at %s/%d/%d: %v", m.Topic, m.Partition, m.Offset, err)
		}
		out = append(out, st)
	}
	return out
}

// freeAddr is a loopback address with a port nobody listens on right now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runCLI runs the binary's run() in-process with env and args.
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}
