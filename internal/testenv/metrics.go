package testenv

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Scrape reads a scorer's /metrics at addr into series → value (series
// written as Prometheus prints them, labels included), so tests of the
// server and of the whole binary read metrics the same way.
func Scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// MetricValue sums the series whose name and labels start with key.
func MetricValue(m map[string]float64, key string) float64 {
	sum := 0.0
	for k, v := range m {
		if k == key || strings.HasPrefix(k, key+"{") || (strings.HasSuffix(key, "}") && k == key) {
			sum += v
		}
	}
	return sum
}
