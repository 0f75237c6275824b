//go:build tools

// Package node pins runc, the OCI runtime under containerd on the cluster lab's real nodes.
// scripts/node-kit.sh builds it with -tags seccomp (cgo, Debian's libseccomp-dev).
package node

import (
	_ "github.com/opencontainers/runc"
)
