//go:build tools

// Package upstream pins the upstream Kubernetes commands that sliceway's cluster lab,
// differential tests and benchmarks run beside sliceway. Nothing here is compiled into
// sliceway: scripts/upstream.sh builds these commands from the Go module proxy into a
// cache keyed by version. The Kubernetes version is the `require k8s.io/kubernetes`
// line of go.mod; every staging module is replaced by its published v0.x.y twin.
package upstream

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
