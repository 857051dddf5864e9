package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// logCounts counts the scorers' log lines whose message is each of msgs.
func logCounts(dir string, msgs ...string) map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "scorer-*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, m := range msgs {
			out[m] += strings.Count(string(b), `"message":"`+m+`"`)
		}
	}
	return out
}

func kv(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func dlqSummary(t tally) string {
	return fmt.Sprintf("%d[%s]", sum(t.dlqReasons), kv(t.dlqReasons))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
