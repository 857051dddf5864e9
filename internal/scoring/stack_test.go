package scoring

import (
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
)

// TestInitORTDefaultNamesORTLib: with ORT_LIB unset the default lies beside
// the executable's folder, where a test binary has no library; the error
// names the variable instead of failing somewhere inside ONNX Runtime.
func TestInitORTDefaultNamesORTLib(t *testing.T) {
	cfg, err := config.FromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InitORT(cfg.ORTLib); err == nil || !strings.Contains(err.Error(), "ORT_LIB") {
		t.Errorf("InitORT(default %q) = %v, want an ORT_LIB error (nothing beside the test binary)", cfg.ORTLib, err)
	}
}

// TestRuntimeKeepsLoadedAfterUnfinishedPool: once a stack's pool did not
// finish closing, its Runtime's Close unloads neither NVML nor ONNX
// Runtime; otherwise it shuts both down, NVML first, once.
func TestRuntimeKeepsLoadedAfterUnfinishedPool(t *testing.T) {
	for _, unfinished := range []bool{false, true} {
		var calls []string
		rt := &Runtime{log: zerolog.Nop(), nvmlTried: true,
			closeNVML: func() { calls = append(calls, "nvml") },
			closeORT:  func() error { calls = append(calls, "ort"); return nil }}
		if unfinished {
			rt.poolUnfinished()
		}
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
		_ = rt.Close()
		want := []string{"nvml", "ort"}
		if unfinished {
			want = nil
		}
		if !slices.Equal(calls, want) {
			t.Errorf("unfinished=%v: Close shut down %v, want %v", unfinished, calls, want)
		}
	}
}
