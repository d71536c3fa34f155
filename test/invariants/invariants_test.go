package invariants

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestRules(t *testing.T) {
	rwo := Volume{PV: "pv-1", SingleNode: true, Names: []string{"kubernetes.io/csi/ebs.csi.aws.com^vol-1", "kubernetes.io/aws-ebs/vol-1"}}
	rwx := Volume{PV: "pv-2", Names: []string{"kubernetes.io/csi/d^2"}}

	if nodes, bad := SingleNode(rwo, []string{"node-b", "node-a"}); !bad || nodes != "node-a, node-b" {
		t.Errorf("SingleNode(rwo on two nodes) = %q, %v; want a violation on node-a, node-b", nodes, bad)
	}
	if _, bad := SingleNode(rwo, []string{"node-a", "node-a"}); bad {
		t.Errorf("SingleNode(rwo twice on one node) is a violation")
	}
	if _, bad := SingleNode(rwx, []string{"node-a", "node-b"}); bad {
		t.Errorf("SingleNode(rwx on two nodes) is a violation")
	}

	node := &v1.Node{Status: v1.NodeStatus{
		VolumesAttached: []v1.AttachedVolume{{Name: "kubernetes.io/aws-ebs/vol-1"}},
		VolumesInUse:    []v1.UniqueVolumeName{"kubernetes.io/aws-ebs/vol-1"},
		Conditions:      []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
	}}
	attached, inUse := NodeLists(node)
	if !DetachListed(rwo, attached) {
		t.Errorf("DetachListed: the in-tree name listed is not seen as the volume")
	}
	if DetachListed(rwx, attached) {
		t.Errorf("DetachListed: another volume is seen as listed")
	}
	if !DetachMounted(rwo, inUse, OutOfServiceTaint(node)) {
		t.Errorf("DetachMounted: a mounted volume on a node without the taint is allowed")
	}
	node.Spec.Taints = []v1.Taint{{Key: OutOfService, Effect: v1.TaintEffectNoExecute}}
	if DetachMounted(rwo, inUse, OutOfServiceTaint(node)) {
		t.Errorf("DetachMounted: the out-of-service taint does not allow the detach")
	}
	if !Ready(node) {
		t.Errorf("Ready: a Ready node is not ready")
	}
}
