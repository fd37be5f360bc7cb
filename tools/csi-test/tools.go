//go:build tools

// Package tools pins csi-sanity (the CSI spec's conformance suite) for tests/csi.
package tools

import _ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
