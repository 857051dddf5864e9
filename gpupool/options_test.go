package gpupool

import (
	"strings"
	"testing"
)

func TestParseMemLimit(t *testing.T) {
	for in, want := range map[string]MemLimit{
		"": {}, "0": {}, "0.45": {Fraction: 0.45}, "1.0": {Fraction: 1}, "12GiB": {Bytes: 12 << 30},
		"12G": {Bytes: 12e9}, "512MiB": {Bytes: 512 << 20}, "12884901888": {Bytes: 12884901888}, " 2 gib ": {Bytes: 2 << 30},
	} {
		got, err := ParseMemLimit(in)
		if err != nil || got != want {
			t.Errorf("ParseMemLimit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"1.5", "0.0", "-1", "12XB", "GiB", "abc", "-0.5"} {
		if got, err := ParseMemLimit(in); err == nil {
			t.Errorf("ParseMemLimit(%q) = %+v, want an error", in, got)
		}
	}
	if got := (MemLimit{Fraction: 0.25}).Of(8 << 30); got != 2<<30 {
		t.Errorf("0.25 of 8 GiB = %d", got)
	}
}

func TestOptionsValidation(t *testing.T) {
	bad := map[string][]Option{
		"tokens":        {MaxBatchTokens(0)},
		"rows":          {MaxBatchRows(-1)},
		"queue":         {withQueueCapacity(10), MaxBatchRows(20)},
		"mode":          {Mode("tpu")},
		"fraction":      {MemFraction(1.5)},
		"hysteresis":    {withUtilizationHysteresis(90, 80)},
		"gpus+cpu":      {Mode(ModeCPU), GPUIDs("0")},
		"cuda+fallback": {Mode(ModeCUDA), CPUFallback(true)},
		"shape":         {Calibrate(Calibration{Shapes: []Shape{{0, 4}}})},
	}
	for name, opts := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := New(testCtx(t), newFakeFactory(nil).factory, opts...)
			if err == nil || !strings.HasPrefix(err.Error(), "gpupool: invalid options") {
				t.Fatalf("err = %v, want invalid options", err)
			}
		})
	}
	if _, err := ParseDeviceMode("gpu"); err == nil {
		t.Error("ParseDeviceMode(gpu) succeeded")
	}
}
