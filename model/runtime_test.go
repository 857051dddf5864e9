package model

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

func TestInitRuntimeErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	tests := []struct {
		name, lib, want string
	}{
		{"empty path", "", "path is empty"},
		{"missing library", missing, missing},
		{"directory", t.TempDir(), "is a directory"},
		// TestMain already initialised the environment with the real
		// library; a second owner must be refused.
		{"already initialized", testenv.ORTLib(t), "already initialized"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			shutdown, err := InitRuntime(tc.lib)
			if err == nil {
				shutdown()
				t.Fatalf("InitRuntime(%q) succeeded, want error", tc.lib)
			}
			if !strings.HasPrefix(err.Error(), "model: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("InitRuntime(%q) = %v, want a model: error mentioning %q", tc.lib, err, tc.want)
			}
		})
	}
}
