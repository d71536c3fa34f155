package migration

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// CSINodeInfoGVR names the CSINodeInfo resource (a CRD of the csi.storage.k8s.io
// alpha API, the predecessor of CSINode) for a dynamic informer. Read-only.
var CSINodeInfoGVR = schema.GroupVersionResource{Group: "csi.storage.k8s.io", Version: "v1alpha1", Resource: "csinodeinfos"}

// Values of CSINodeInfo status.drivers[].volumePluginMechanism.
const (
	MechanismInTree = "in-tree"
	MechanismCSI    = "csi"
)

// CSINodeInfo is the part of a CSINodeInfo object this controller reads.
// The object is cluster-scoped and named after its node.
type CSINodeInfo struct {
	Name   string            `json:"-"`
	Spec   CSINodeInfoSpec   `json:"spec"`
	Status CSINodeInfoStatus `json:"status"`
}

// CSINodeInfoSpec lists the CSI drivers kubelet registered on the node.
type CSINodeInfoSpec struct {
	Drivers []CSIDriverInfoSpec `json:"drivers,omitempty"`
}

// CSIDriverInfoSpec is one registered driver.
type CSIDriverInfoSpec struct {
	Name         string   `json:"name"`
	NodeID       string   `json:"nodeID,omitempty"`
	TopologyKeys []string `json:"topologyKeys,omitempty"`
}

// CSINodeInfoStatus says, per driver, whether it is usable and which
// mechanism handles the volumes of the in-tree plugin it replaces.
type CSINodeInfoStatus struct {
	Drivers []CSIDriverInfoStatus `json:"drivers,omitempty"`
}

// CSIDriverInfoStatus is the status of one driver.
type CSIDriverInfoStatus struct {
	Name                  string `json:"name"`
	Available             bool   `json:"available"`
	VolumePluginMechanism string `json:"volumePluginMechanism"`
}

// ParseCSINodeInfo reads a CSINodeInfo object as a dynamic informer delivers
// it (*unstructured.Unstructured).
func ParseCSINodeInfo(obj runtime.Object) (*CSINodeInfo, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("parse CSINodeInfo: got %T, want *unstructured.Unstructured", obj)
	}
	info := &CSINodeInfo{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, info); err != nil {
		return nil, fmt.Errorf("parse CSINodeInfo %s: %w", u.GetName(), err)
	}
	info.Name = u.GetName()
	return info, nil
}

// driverStatus returns the status entry of driver, if any.
func (i *CSINodeInfo) driverStatus(driver string) (CSIDriverInfoStatus, bool) {
	for _, d := range i.Status.Drivers {
		if d.Name == driver {
			return d, true
		}
	}
	return CSIDriverInfoStatus{}, false
}

// CSINodeInfoServed asks discovery whether the API server serves the
// CSINodeInfo resource (its CRD is installed and established).
func CSINodeInfoServed(d discovery.DiscoveryInterface) (bool, error) {
	gv := CSINodeInfoGVR.GroupVersion().String()
	list, err := d.ServerResourcesForGroupVersion(gv)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	for _, r := range list.APIResources {
		if r.Name == CSINodeInfoGVR.Resource {
			return true, nil
		}
	}
	return false, nil
}
