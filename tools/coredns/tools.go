//go:build tools

// Package tools pins CoreDNS, the cluster DNS of the kind suite's node image
// (hack/build-kind-node-image.sh), at the version kubeadm deploys.
package tools

import _ "github.com/coredns/coredns"
