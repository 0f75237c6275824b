//go:build tools

// Package node pins CoreDNS, the cluster DNS of the lab with real nodes.
package node

import (
	_ "github.com/coredns/coredns"
)
