package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// TestKcatTraceContext: input records carrying W3C trace context
// (traceparent, tracestate) pass it on, so a trace crosses the scorer: each
// result and row carries its own input record's headers, after the
// scorer's own headers, which stay as they were; two versions of one call
// keep their own; a dead letter keeps it; a record without trace context
// gets none. kcat writes one record per call (-H sets every record of a
// call) and reads them back (-J).
func TestKcatTraceContext(t *testing.T) {
	if testing.Short() {
		t.Skip("scores real transcripts")
	}
	kcat := kcatPath(t)
	cluster, broker, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	metricsAddr := freeAddr(t)
	env := withEnv(testenv.ScorerEnv(t), "MODEL_DIR", testenv.ModelDir(t, "nli-unigram-small"), "KAFKA_BROKERS", broker,
		"METRICS_ADDR", metricsAddr, "KAFKA_INPUT_PARTITIONS", "1", "LABELS", "consumer weakness",
		"OUTPUT_ROWS_TOPIC", "transcripts.rows")
	stop := runInProcess(t, env)
	waitReady(t, metricsAddr, 90*time.Second)

	parent := func(n int) string { return fmt.Sprintf("00-%032x-%016x-01", n, n) }
	type input struct {
		key, value, parent, state string
	}
	ev := func(id, text string) string {
		return fmt.Sprintf(`{"call_id":%q,"sections":{"FILT_MD":[%q]}}`, id, text)
	}
	inputs := []input{ // offsets 0 to 4
		{"TRACE-A", ev("TRACE-A", "Consumers kept spending on travel."), parent(1), "vendor=a,other=b"},
		{"TRACE-V", ev("TRACE-V", "Households cut back on dining out."), parent(2), ""},
		{"TRACE-V", ev("TRACE-V", "Households cut back on dining out and travel."), parent(3), "vendor=v2"},
		{"TRACE-NONE", ev("TRACE-NONE", "Demand was strong."), "", ""},
		{"TRACE-BAD", `{"call_id": "TRACE-BAD", "sections": {`, parent(5), "vendor=bad"},
	}
	for _, in := range inputs {
		args := []string{"-P", "-b", broker, "-t", "transcripts", "-K", "\t", "-H", "origin=kcat"}
		if in.parent != "" {
			args = append(args, "-H", "traceparent="+in.parent)
		}
		if in.state != "" {
			args = append(args, "-H", "tracestate="+in.state)
		}
		prod := exec.Command(kcat, args...)
		prod.Stdin = strings.NewReader(in.key + "\t" + in.value + "\n")
		if out, err := prod.CombinedOutput(); err != nil {
			t.Fatalf("kcat -P: %v\n%s", err, out)
		}
	}

	// check holds r's headers to what the input at offset sent: the
	// scorer's own headers first, as before, then the input's trace context.
	check := func(what string, r kcatRecord, offset int) {
		t.Helper()
		in := inputs[offset]
		own := []string{schema.HeaderModelSHA256, schema.HeaderContentSHA256, schema.HeaderSourceTopic,
			schema.HeaderSourcePartition, schema.HeaderSourceOffset, schema.HeaderSourceGeneration}
		var want []string
		if in.parent != "" {
			want = append(want, "traceparent")
		}
		if in.state != "" {
			want = append(want, "tracestate")
		}
		var names []string
		for i := 0; i+1 < len(r.Headers); i += 2 {
			names = append(names, r.Headers[i])
		}
		if got, exp := strings.Join(names, ","), strings.Join(append(own, want...), ","); got != exp {
			t.Errorf("%s of offset %d: headers %s, want %s", what, offset, got, exp)
		}
		if v, _ := r.header("traceparent"); v != in.parent {
			t.Errorf("%s of offset %d: traceparent %q, want %q", what, offset, v, in.parent)
		}
		if v, _ := r.header("tracestate"); v != in.state {
			t.Errorf("%s of offset %d: tracestate %q, want %q", what, offset, v, in.state)
		}
	}
	offsetOf := func(r kcatRecord) int {
		t.Helper()
		v, _ := r.header(schema.HeaderSourceOffset)
		var n int
		if _, err := fmt.Sscan(v, &n); err != nil || n < 0 || n >= len(inputs) {
			t.Fatalf("output record with source offset %q", v)
		}
		return n
	}
	seen := map[int]bool{}
	for _, r := range kcatConsume(t, broker, "transcripts.scored", 4) {
		n := offsetOf(r)
		seen[n] = true
		check("result", r, n)
	}
	for _, r := range kcatConsume(t, broker, "transcripts.rows", 4) {
		check("row", r, offsetOf(r))
	}
	if len(seen) != 4 {
		t.Errorf("results for offsets %v, want 0 to 3", seen)
	}

	dls := kcatConsume(t, broker, "transcripts.dlq", 1)
	if v, _ := dls[0].header("traceparent"); v != parent(5) {
		t.Errorf("dead letter traceparent %q, want %q (headers %v)", v, parent(5), dls[0].Headers)
	}
	if v, _ := dls[0].header("tracestate"); v != "vendor=bad" {
		t.Errorf("dead letter tracestate %q, want vendor=bad", v)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
