package scoring

import (
	"strings"
	"testing"

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
