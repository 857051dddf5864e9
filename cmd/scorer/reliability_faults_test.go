package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/faultproxy"
	"github.com/scorer/scorer/internal/kafkatest"
	"github.com/scorer/scorer/internal/testenv"
)

// startProxiedBroker is kfake in-process behind a faultproxy. kfake
// advertises its listener's address in Metadata and FindCoordinator, so
// the listener is wrapped (faultproxy.AdvertiseAs) to report the proxy's
// address: every connection of every client, after bootstrap too, then
// goes through the proxy. The test's own clients go through it as well
// and simply retry.
func startProxiedBroker(t *testing.T, partitions int) (*kfake.Cluster, *faultproxy.Proxy) {
	t.Helper()
	px, err := faultproxy.Listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(partitions),
		kfake.SeedTopics(int32(partitions), "transcripts"),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			ln, err := net.Listen(network, "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			px.SetTarget(ln.Addr().String())
			return faultproxy.AdvertiseAs(ln, px.Addr()), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if got := c.ListenAddrs()[0]; got != px.Addr() {
		t.Fatalf("kfake advertises %s, want the proxy %s", got, px.Addr())
	}
	createOutputTopics(t, px.Addr(), partitions)
	return c, px
}

// failRequests makes the broker answer the next n requests of key with
// errCode on every partition (a retriable broker error), then behave
// normally again. It returns the count of requests failed so far.
func failRequests(c *kfake.Cluster, key int16, n int64, errCode int16) *atomic.Int64 {
	var failed atomic.Int64
	c.ControlKey(key, func(req kmsg.Request) (kmsg.Response, error, bool) {
		if failed.Load() >= n {
			return nil, nil, false // handled normally; the control is kept but inert
		}
		c.KeepControl()
		failed.Add(1)
		switch r := req.(type) {
		case *kmsg.ProduceRequest:
			return kafkatest.ProduceError(r, errCode), nil, true
		case *kmsg.OffsetCommitRequest:
			return kafkatest.OffsetCommitError(r, errCode), nil, true
		}
		return nil, fmt.Errorf("unexpected request %T", req), true
	})
	return &failed
}

// TestReliabilityBrokerFaults runs the scorer process against a broker
// behind a fault proxy and, while work flows, cuts every connection three
// times, delays every byte by 200 ms for 5 s, pauses all traffic for 12 s
// (longer than the producer's 10 s write timeout), and has the broker fail
// Produce and OffsetCommit requests with retriable errors. The scorer must
// retry and recover on its own: every input scored, commits at the end.
func TestReliabilityBrokerFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("broker fault drill")
	}
	const (
		n     = 2500
		group = "fault-drill"
	)
	start := time.Now()
	cluster, px := startProxiedBroker(t, 3)
	broker := px.Addr()
	ids := produceSmallEvents(t, broker, n, "FAULT")
	out := watchTopic(t, broker, "transcripts.scored", nil)
	p := startScorerProcess(t, relEnv(t, "KAFKA_BROKERS", broker, "KAFKA_GROUP_ID", group, "LABELS", "consumer weakness",
		"KAFKA_INPUT_PARTITIONS", "3"))
	progress := func(what string, min int) {
		before := out.len()
		waitUntil(t, 3*time.Minute, fmt.Sprintf("%s: %d new outputs", what, min), func() bool { return out.len() >= before+min },
			func() string { return fmt.Sprintf("%d outputs; proxy %+v", out.len(), px.Stats()) })
		t.Logf("%-32s at %5.1fs: %4d outputs, proxy %+v", what, time.Since(start).Seconds(), out.len(), px.Stats())
	}
	progress("start", 100)

	for i := range 3 {
		cut := px.Cut()
		progress(fmt.Sprintf("cut %d (%d connections)", i+1, cut), 150)
	}

	px.SetDelay(200 * time.Millisecond)
	time.Sleep(5 * time.Second)
	px.SetDelay(0)
	progress("after 5s of 200ms delay", 50)

	px.Pause()
	// The test's own readers may still hand out records they buffered
	// before the pause: count from a second into it.
	time.Sleep(time.Second)
	paused := out.len()
	time.Sleep(11 * time.Second)
	if got := out.len(); got != paused {
		t.Errorf("%d outputs arrived while the proxy was paused: the pause did not hold", got-paused)
	}
	px.Resume()
	progress("after a 12s pause", 50)

	produceFails := failRequests(cluster, int16(kmsg.Produce), 6, kerr.NotLeaderForPartition.Code)
	waitUntil(t, time.Minute, "6 failed Produce requests", func() bool { return produceFails.Load() >= 6 }, nil)
	progress("after 6 failed Produce", 50)
	commitFails := failRequests(cluster, int16(kmsg.OffsetCommit), 3, kerr.CoordinatorLoadInProgress.Code)
	waitUntil(t, time.Minute, "3 failed OffsetCommit requests", func() bool { return commitFails.Load() >= 3 }, nil)
	progress("after 3 failed OffsetCommit", 50)
	if produceFails.Load() != 6 || commitFails.Load() != 3 {
		t.Errorf("injected %d Produce and %d OffsetCommit failures, want 6 and 3", produceFails.Load(), commitFails.Load())
	}

	out.waitKeys(t, n, 5*time.Minute)
	waitCommittedToEnd(t, broker, group, "transcripts", 2*time.Minute)
	if _, err := signalAndWait(t, p, syscall.SIGTERM, 40*time.Second); err != nil {
		t.Errorf("scorer exit after SIGTERM: %v", err)
	}
	msgs, bySrc, _ := checkAllScored(t, broker, out, ids)
	logText := p.log.String()
	t.Logf("broker faults: %d inputs, %d outputs, %d duplicates, %v; scorer logged %d publish retries, %d commit failures, %d fetch retries, %d failed rejoins, %d generations",
		n, len(msgs), len(msgs)-len(bySrc), time.Since(start).Round(time.Second),
		strings.Count(logText, "publish failed; retrying"), strings.Count(logText, "commit failed"),
		strings.Count(logText, "fetch failed; retrying"), strings.Count(logText, "consumer group generation failed"),
		strings.Count(logText, "generation started"))
}

// TestReliabilityBrokerDownAtStartup starts the scorer before its broker:
// it must log that Kafka is not reachable, keep retrying with growing
// pauses, report not ready on /readyz, and become ready and score once a
// `scorer broker` process comes up on that address.
func TestReliabilityBrokerDownAtStartup(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for start-up retries")
	}
	addr := freeAddr(t)
	metrics := freeAddr(t)
	p := startScorerProcess(t, relEnv(t, "KAFKA_BROKERS", addr, "METRICS_ADDR", metrics, "LABELS", "consumer weakness"))
	waitLog(t, p, `"attempt":3`, time.Minute)
	if !strings.Contains(p.log.String(), "Kafka not reachable yet; retrying") {
		t.Fatalf("no clear retry line in the log:\n%s", testenv.Tail(p.log.String(), 2000))
	}
	resp, err := http.Get("http://" + metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d while the broker is down, want 503", resp.StatusCode)
	}
	brokerUp := time.Now()
	startBrokerProcessAt(t, addr, 3)
	waitReady(t, metrics, 60*time.Second)
	readyAfter := time.Since(brokerUp)
	produceSmallEvents(t, addr, 20, "LATE")
	if got := readTopic(t, addr, "transcripts.scored", 20, 2*time.Minute); len(got) != 20 {
		t.Fatalf("%d of 20 scored after the broker came up", len(got))
	}
	if _, err := signalAndWait(t, p, syscall.SIGTERM, 40*time.Second); err != nil {
		t.Errorf("scorer exit: %v", err)
	}
	attempts := strings.Count(p.log.String(), "Kafka not reachable yet; retrying")
	t.Logf("broker down at start-up: %d logged retries (backoff 0.5s doubling to 15s), ready %v after the broker came up",
		attempts, readyAfter.Round(time.Millisecond))
	if readyAfter > 30*time.Second {
		t.Errorf("ready only %v after the broker came up", readyAfter)
	}
}
