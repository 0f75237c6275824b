//go:build tools

// Package node pins crictl, the CRI client used to check a real node's containerd.
package node

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
