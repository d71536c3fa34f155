package migration

import (
	"fmt"
	"strings"
	"time"
)

// DriverNotInstalledError: the node's CSINode says the plugin is migrated,
// but the CSI driver that replaces it is not registered there (yet).
type DriverNotInstalledError struct {
	Plugin, Node, Driver string
	// Since is when the CSINode was created: kubelet creates it at start,
	// before its drivers register.
	Since time.Time
}

// PendingSince is when the driver could first have been registered.
func (e *DriverNotInstalledError) PendingSince() time.Time { return e.Since }

func (e *DriverNotInstalledError) Error() string {
	return fmt.Sprintf("in-tree plugin %s is migrated on node %s but driver %s is not installed", e.Plugin, e.Node, e.Driver)
}

// DriverNotAvailableError: the node's CSINodeInfo says the CSI driver handles
// the plugin's volumes but is not available.
type DriverNotAvailableError struct {
	Driver, Node string
}

func (e *DriverNotAvailableError) Error() string {
	return fmt.Sprintf("CSI driver %s is not available on node %s (CSINodeInfo)", e.Driver, e.Node)
}

// NodeInfoMissingError: none of the objects that tell whether the node
// migrated the plugin exists yet. kubelet creates them when it starts, so the
// answer is only delayed: retry when one of Objects appears.
type NodeInfoMissingError struct {
	Node   string
	Plugin string
	// Objects are the kinds looked for, all named after the node:
	// "CSINode", and "CSINodeInfo" when that CRD is watched.
	Objects []string
}

func (e *NodeInfoMissingError) Error() string {
	return fmt.Sprintf("waiting for %s %s to decide whether in-tree plugin %s is migrated",
		strings.Join(e.Objects, " or "), e.Node, e.Plugin)
}
