//go:build !windows

package server

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketControl sets SO_REUSEPORT (--permit-port-sharing) and SO_REUSEADDR
// (--permit-address-sharing) on the listening socket.
func socketControl(portSharing, addressSharing bool) func(network, address string, c syscall.RawConn) error {
	if !portSharing && !addressSharing {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		var opErr error
		err := c.Control(func(fd uintptr) {
			if portSharing {
				if opErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); opErr != nil {
					opErr = fmt.Errorf("set SO_REUSEPORT: %w", opErr)
					return
				}
			}
			if addressSharing {
				if opErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); opErr != nil {
					opErr = fmt.Errorf("set SO_REUSEADDR: %w", opErr)
				}
			}
		})
		if err != nil {
			return err
		}
		return opErr
	}
}
