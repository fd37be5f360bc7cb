//go:build tools

// Package tools pins the Kubernetes commands unstick's tests run: kube-apiserver,
// kubectl and kube-controller-manager, and for the real-node suite kube-scheduler and
// kubelet, and for the kind suite's node image kubeadm and kube-proxy, built from the
// published k8s.io/kubernetes module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
