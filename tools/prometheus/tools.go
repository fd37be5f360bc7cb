//go:build tools

// Package tools pins the Prometheus server (same module and version as promtool), run by
// the tests in tests/prometheus to scrape the controller and the agent and evaluate the
// chart's alerts.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
