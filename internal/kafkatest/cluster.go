package kafkatest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cluster is a real Apache Kafka cluster started by scripts/kafka.sh for one test: the same script
// contributors and the soak run, so a test's faults are the ones a person can repeat by hand.
type Cluster struct {
	t         testing.TB
	script    string
	dir       string
	bootstrap []string
	pids      map[int]bool // every JVM this cluster started; Cleanup checks each is gone
}

// scriptDeadline bounds every call of the script; the script's own waits are shorter.
const scriptDeadline = 3 * time.Minute

// StartCluster starts an n-node cluster (extra broker properties as KAFKA_BROKER_CONFIG takes them,
// k=v per element) and registers a Cleanup that ends it and fails the test if any JVM it started is
// left. It skips the test, naming the command to run, when the jars are not fetched.
func StartCluster(t testing.TB, n int, config ...string) *Cluster {
	t.Helper()
	script, err := findScript()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, script: script, dir: t.TempDir(), pids: map[int]bool{}}
	if out, err := c.run("libs"); err != nil {
		t.Skipf("Apache Kafka's jars are not fetched (make kafka fetches them; make test does): %s", out)
	}
	t.Cleanup(c.down)
	out, err := c.runEnv([]string{"KAFKA_BROKER_CONFIG=" + strings.Join(config, "\n")}, "up", strconv.Itoa(n))
	if err != nil {
		t.Fatalf("scripts/kafka.sh up %d: %v\n%s", n, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	list, ok := strings.CutPrefix(last, "bootstrap=")
	if !ok {
		t.Fatalf("scripts/kafka.sh up's last line is %q, not bootstrap=...", last)
	}
	c.bootstrap = strings.Split(list, ",")
	for i := 1; i <= n; i++ {
		c.recordPid(i)
	}
	return c
}

// Bootstrap is every node's client address.
func (c *Cluster) Bootstrap() []string { return c.bootstrap }

// Kill SIGKILLs node i (1-based, as the script counts and as its node.id).
func (c *Cluster) Kill(i int) { c.node("kill", i) }

// Stop SIGTERMs node i and waits for it to exit (SIGKILL at the script's deadline).
func (c *Cluster) Stop(i int) { c.node("stop", i) }

// Start restarts node i on its data and ports and waits until it serves metadata listing itself.
func (c *Cluster) Start(i int) {
	c.node("start", i)
	c.recordPid(i)
}

// Pause SIGSTOPs node i; Resume SIGCONTs it.
func (c *Cluster) Pause(i int)  { c.node("pause", i) }
func (c *Cluster) Resume(i int) { c.node("resume", i) }

func (c *Cluster) node(verb string, i int) {
	c.t.Helper()
	if out, err := c.run(verb, strconv.Itoa(i)); err != nil {
		c.t.Fatalf("scripts/kafka.sh %s %d: %v\n%s", verb, i, err, out)
	}
}

func (c *Cluster) recordPid(i int) {
	c.t.Helper()
	out, err := c.run("pid", strconv.Itoa(i))
	if err != nil {
		c.t.Fatalf("scripts/kafka.sh pid %d: %v\n%s", i, err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		c.t.Fatalf("scripts/kafka.sh pid %d printed %q", i, out)
	}
	c.pids[pid] = true
}

// down ends the cluster, then checks every pid the cluster ever had is gone: a JVM left behind
// fails the test (and is SIGKILLed, so one failure does not starve the tests after it).
func (c *Cluster) down() {
	if out, err := c.run("down"); err != nil {
		c.t.Errorf("scripts/kafka.sh down: %v\n%s", err, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for pid := range c.pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			c.t.Errorf("Kafka node pid %d is still running after scripts/kafka.sh down; SIGKILLing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if c.t.Failed() {
		for _, log := range mustGlob(filepath.Join(c.dir, "node-*", "server.log")) {
			data, _ := os.ReadFile(log)
			if len(data) > 4000 {
				data = data[len(data)-4000:]
			}
			c.t.Logf("the end of %s:\n%s", log, data)
		}
	}
}

// alive: pid is a process that is not a zombie (nothing may reap a detached JVM at once).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

func mustGlob(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

func (c *Cluster) run(args ...string) (string, error) { return c.runEnv(nil, args...) }

func (c *Cluster) runEnv(env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scriptDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.script, args...)
	cmd.Env = append(append(os.Environ(), "KAFKA_CLUSTER_DIR="+c.dir), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	return out.String(), err
}

// findScript walks up from the test's folder to the repository's scripts/kafka.sh.
func findScript() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(d, "scripts", "kafka.sh")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("scripts/kafka.sh not found above the test's folder")
		}
		d = parent
	}
}
