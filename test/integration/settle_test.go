package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A detach the controller started whose outcome it does not know, while a
// pod on the same node wants the volume again: kubelet lists the volume in
// volumesInUse before it is attached, so finishing the detach, which waits
// for the volume to leave that list, would never happen. The outcome is
// settled from what the API shows, and the pod gets its volume.

// settleSetup attaches vol-1 for pod-1 on a node, mounted; then pod-1 goes
// and kubelet unmounts the volume: the controller withdraws it from node
// status and deletes its VolumeAttachment. It returns the node, the
// volume's name, its PV and its VolumeAttachment.
func settleSetup(e *env, driver string) (node, vol, pv string, va *storagev1.VolumeAttachment) {
	e.t.Helper()
	node = e.createNode("node", true)
	pv = e.createCSIClaim("claim", driver, "vol-1").Name
	vol = framework.CSIVolumeName(driver, "vol-1")
	e.setVolumesInUse(node, vol)
	e.createPod("pod-1", node, "claim")
	return node, vol, pv, e.waitAttached(driver, "vol-1", node)
}

// explainer is the /explain of a controller whose handlers it serves on
// a plainEndpoint, set in its options by configure.
type explainer struct {
	e       *env
	ln      net.Listener
	baseURL string
}

func newExplainer(e *env) *explainer {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = ln.Close() }) // closed already once served
	return &explainer{e: e, ln: ln, baseURL: "http://" + ln.Addr().String()}
}

func (x *explainer) configure(o *app.Options) { o.Serving = &plainEndpoint{ln: x.ln} }

// explain asks the controller's /explain about vol on node.
func (x *explainer) explain(vol, node string) (controller.Explanation, error) {
	var got controller.Explanation
	ctx, cancel := context.WithTimeout(x.e.ctx, 10*time.Second)
	defer cancel()
	q := url.Values{"volume": {vol}, "node": {node}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, x.baseURL+"/explain?"+q.Encode(), nil)
	if err != nil {
		return got, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return got, fmt.Errorf("explain %s on %s: %w", vol, node, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return got, fmt.Errorf("explain %s on %s: %w", vol, node, err)
	}
	if resp.StatusCode != http.StatusOK {
		return got, fmt.Errorf("explain %s on %s: status %s: %s", vol, node, resp.Status, body)
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return got, fmt.Errorf("explain %s on %s: %w: %s", vol, node, err, body)
	}
	return got, nil
}

// The delete of the VolumeAttachment is refused, as an admission webhook
// refuses it; pod-2 then wants the volume on the same node, and kubelet
// lists it in use. The VolumeAttachment, which the API shows not being
// deleted, was never detached: the volume is listed in node status again,
// and no delete is tried again.
func TestRefusedDetachIsSettledForAPodThatWantsTheVolumeAgain(t *testing.T) {
	e := newEnv(t, "settle-refused")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	e.startControllerVia(p, nil)
	node, vol, _, va := settleSetup(e, driver)
	vaName := va.Name
	lift, refused := p.refuse(isCall(http.MethodDelete, "volumeattachments/"+vaName),
		`admission webhook "deny-detach.adc.test" denied the request: detach refused by the test`)
	vw := e.watchVA(va)

	e.deletePod("pod-1")
	e.setVolumesInUse(node)
	framework.Eventually(t, waitTimeout, func() (bool, error) { return refused() > 0, nil },
		"the detach of %s attempted (and refused)", vaName)
	e.setVolumesInUse(node, vol)
	e.createPod("pod-2", node, "claim")
	e.waitListed(node, vol)
	tried := refused()
	framework.Consistently(t, quietPeriod, func() error {
		if n := refused(); n != tried {
			return fmt.Errorf("%d more deletes of %s tried", n-tried, vaName)
		}
		_, listed, err := e.attachedInStatus(node, vol)
		if err == nil && !listed {
			err = fmt.Errorf("node %s status no longer lists %s", node, vol)
		}
		return err
	}, "the volume listed, and no detach tried, while pod-2 wants it")
	lift()
	framework.Consistently(t, quietPeriod, vw.intact, "the VolumeAttachment of the volume pod-2 wants to stay")
	if err := vw.intact(); err != nil {
		t.Error(err)
	}
}

// The delete of the VolumeAttachment lands (no finalizer holds it: it is
// gone at once) and its answer is lost; meanwhile kubelet lists the volume
// in use again and pod-2 wants it on the same node. The API shows the
// object gone: the volume is attached anew, and its node status never
// lists it while no attached VolumeAttachment of it exists.
func TestLostDetachAnswerIsSettledForAPodThatWantsTheVolumeAgain(t *testing.T) {
	e := newEnv(t, "settle-lost")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startControllerVia(p, x.configure)
	node, vol, pv, attached := settleSetup(e, driver)
	vaName := attached.Name
	sw := e.watchStatusAndAttachments(node, map[string]string{pv: vol})
	lost := p.loseAnswerOf(isCall(http.MethodDelete, "volumeattachments/"+vaName))

	e.deletePod("pod-1")
	e.setVolumesInUse(node)
	waitClosed(t, lost.held, waitTimeout, "the delete of "+vaName+" landed, its answer held")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, ok, err := e.getVA(vaName)
		return !ok, err
	}, "VolumeAttachment %s gone", vaName)
	// Kubelet lists the volume in use, and pod-2 wants it, both read by
	// the controller before the answer comes.
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

	again := e.waitAttached(driver, "vol-1", node)
	if again.UID == attached.UID {
		t.Errorf("VolumeAttachment %s: the one deleted, UID %s", vaName, again.UID)
	}
	if err := sw.listedUnattached(); err != nil {
		t.Error(err)
	}
}

// listedUnattached is an error naming every node version, in the order
// etcd wrote them, whose status lists a volume while no VolumeAttachment
// of it exists attached and not being deleted.
func (sw *statusWatch) listedUnattached() error {
	sw.mu.Lock()
	events := slices.Clone(sw.events)
	out := slices.Clone(sw.bad)
	sw.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].rv < events[j].rv })
	watched := map[string]bool{}
	for _, vol := range sw.volumes {
		watched[vol] = true
	}
	attached := map[string]bool{} // volume name -> an attached VolumeAttachment exists
	for _, ev := range events {
		if va := ev.va; va != nil {
			attached[sw.volumes[*va.Spec.Source.PersistentVolumeName]] = ev.typ != watch.Deleted && va.Status.Attached && va.DeletionTimestamp == nil
			continue
		}
		for _, vol := range attachedNames(ev.node) {
			if watched[vol] && !attached[vol] {
				out = append(out, fmt.Sprintf("node %s status lists %s at resourceVersion %d, and no VolumeAttachment of it is attached", sw.node, vol, ev.rv))
			}
		}
	}
	if len(out) > 0 {
		return fmt.Errorf("%s", strings.Join(out, "; "))
	}
	return nil
}
