//go:build tools

// Package node pins the CNI plugins of the cluster lab's real nodes: ptp for the pod
// veths, host-local for addresses from the node's pod CIDR, portmap for HostPort, loopback.
package node

import (
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
