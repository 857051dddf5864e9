//go:build tools

// Package tools pins modules that the build needs before any package imports them.
package tools

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/caarlos0/env/v11"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/rs/zerolog"
	_ "github.com/segmentio/kafka-go"
	_ "github.com/twmb/franz-go/pkg/kfake"
	_ "github.com/twmb/franz-go/pkg/kgo"
	_ "github.com/twmb/franz-go/pkg/kmsg"
	_ "github.com/yalue/onnxruntime_go"
	_ "golang.org/x/term"
	_ "golang.org/x/text/unicode/norm"
)
