package server

import "syscall"

// socketControl: neither option is supported on Windows, as in
// kube-controller-manager.
func socketControl(bool, bool) func(network, address string, c syscall.RawConn) error { return nil }
