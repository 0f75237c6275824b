//go:build tools

// Package node pins the container runtime of the cluster lab's real nodes: containerd v2,
// its runc shim and ctr. scripts/node-kit.sh builds them with CGO_ENABLED=0.
package node

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
