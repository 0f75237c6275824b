//go:build tools

// Package node pins what a real node of the cluster lab runs from Kubernetes itself: the
// kubelet, kube-proxy (the image of a cluster that runs it), agnhost (the e2e suite's
// test image), the e2e suite and ginkgo's command that runs it, all from the same
// k8s.io/kubernetes as ../../go.mod, whose staging modules are replaced by their
// published twins here too.
// scripts/node-kit.sh builds them; nothing here is compiled into sliceway.
package node

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
