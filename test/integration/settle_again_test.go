package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A detach of unknown outcome settled against a VolumeAttachment someone
// else (a second attach/detach controller, an admin) created again under
// the same name after the controller's delete landed, while the
// controller's informer is behind: the settle's GET is the first to show
// the new object, and the informer then reads the deletion of the old one
// before the creation of the new one. That deletion says nothing of the
// object there now: the volume stays attached to its node and listed, and
// a pod on another node that wants the ReadWriteOnce volume keeps waiting.
// (Before the fix, this failed in 4 runs of 6, with the volume attached to
// both nodes; the timing of the first attach decides the rest. The
// controller's unit tests pin it every time:
// pkg/controller/settle_attack_test.go.)
func TestSettledDetachOfAVolumeAttachmentCreatedAgainOutlivesTheOldOnesDeletion(t *testing.T) {
	e := newEnv(t, "settle-again")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startControllerVia(p, x.configure)
	node, vol, pv, attached := settleSetup(e, driver)
	node2 := e.createNode("node-2", true)
	vaName := attached.Name
	lost := p.loseAnswerOf(isCall(http.MethodDelete, "volumeattachments/"+vaName))
	p.holdEvents("volumeattachments")

	e.deletePod("pod-1")
	e.setVolumesInUse(node)
	waitClosed(t, lost.held, waitTimeout, "the delete of "+vaName+" landed, its answer held")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, ok, err := e.getVA(vaName)
		return !ok, err
	}, "VolumeAttachment %s gone", vaName)
	// Someone else creates it again; the attacher attaches it.
	pvName := pv
	again := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		va, ok, err := e.getVA(vaName)
		return ok && va.Status.Attached, err
	}, "VolumeAttachment %s created again and attached", vaName)
	// Kubelet lists the volume in use, and pod-2 wants it on the same node.
	e.setVolumesInUse(node, vol)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return strings.Contains(got.Reason, "volumesInUse"), err
	}, "the controller read that node %s lists %s in use", node, vol)
	e.createPod("pod-2", node, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return got.Desired, err
	}, "the controller read pod-2")
	lost.release()
	// The settle reads the object created again, attached: listed again.
	e.waitListed(node, vol)
	// pod-3 on node-2 wants the ReadWriteOnce volume: it waits.
	e.createPod("pod-3", node2, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node2)
		return strings.Contains(got.Reason, "exclusively attached to node "+node), err
	}, "pod-3 waits for the volume held on node %s", node)

	// The informer reads the deletion of the object deleted; the creation
	// of the one after it is still on its way.
	p.releaseThrough("volumeattachments", isEvent("DELETED", vaName, attached.UID))
	other := framework.VolumeAttachmentName("vol-1", driver, node2)
	framework.Consistently(t, quietPeriod, func() error {
		if _, ok, err := e.getVA(other); err != nil || ok {
			return fmt.Errorf("the ReadWriteOnce volume is attached to node %s too (VolumeAttachment %s), while %s holds it: %w", node2, other, node, err)
		}
		if _, listed, err := e.attachedInStatus(node, vol); err != nil || !listed {
			return fmt.Errorf("node %s status no longer lists %s, attached there: %w", node, vol, err)
		}
		return nil
	}, "the volume stays on node %s alone once the old object's deletion is read", node)
	p.releaseEvents("volumeattachments")
	framework.Consistently(t, quietPeriod, func() error {
		if _, ok, err := e.getVA(other); err != nil || ok {
			return fmt.Errorf("the ReadWriteOnce volume is attached to node %s too: %w", node2, err)
		}
		return nil
	}, "node %s still waits once every event is read", node2)
}

// isEvent matches a watch event of the given type of the object name with uid.
func isEvent(typ, name string, uid types.UID) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			} `json:"object"`
		}
		if json.Unmarshal(raw, &ev) != nil {
			return false
		}
		return ev.Type == typ && ev.Object.Metadata.Name == name && ev.Object.Metadata.UID == uid
	}
}

// releaseThrough writes, on each watch of resource, the held events up to
// and including the first that match selects, and keeps holding the rest
// (and those still to come). It waits until some watch holds such an event.
func (p *apiProxy) releaseThrough(resource string, match func(json.RawMessage) bool) {
	p.t.Helper()
	type restOf struct {
		first json.RawMessage
		rest  []json.RawMessage
	}
	var rests map[*watchStream]restOf
	framework.Eventually(p.t, waitTimeout, func() (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		rests = map[*watchStream]restOf{}
		for s := range p.watchesOf(resource).streams {
			i := slices.IndexFunc(s.pending, match)
			if i < 0 {
				continue
			}
			rests[s] = restOf{first: s.pending[0], rest: slices.Clone(s.pending[i+1:])}
			s.pending = s.pending[: i+1 : i+1]
			select {
			case s.release <- struct{}{}:
			default:
			}
		}
		return len(rests) > 0, nil
	}, "a watch of %s holds the event to release", resource)
	// Once a stream has taken its batch, what it held after it goes back
	// in front of what came since.
	framework.Eventually(p.t, waitTimeout, func() (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for s, r := range rests {
			if len(s.pending) > 0 && string(s.pending[0]) == string(r.first) {
				return false, nil
			}
			s.pending = append(r.rest, s.pending...)
			delete(rests, s)
		}
		return true, nil
	}, "the watches of %s wrote the events released", resource)
}

// releaseEvents writes every held event of resource and stops holding them.
func (p *apiProxy) releaseEvents(resource string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rw := p.watchesOf(resource)
	rw.held = false
	for s := range rw.streams {
		select {
		case s.release <- struct{}{}:
		default:
		}
	}
}
