//go:build tools

// Package tools pins kind, which runs the end-to-end suite's multi-node cluster (tests/kind)
// in podman containers.
package tools

import _ "sigs.k8s.io/kind"
