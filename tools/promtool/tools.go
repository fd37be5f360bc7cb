//go:build tools

// Package tools pins promtool, used to check the chart's PrometheusRule in tests.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
