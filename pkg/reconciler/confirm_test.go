package reconciler

import (
	"errors"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A single-node volume that a pod on node-2 wants is held on node-1, not
// Ready (or gone) with the volume in use, by an attachment of unknown
// outcome no VolumeAttachment of which was seen (a third party deleted it
// and the create again failed; node status alone named it after a
// restart). A detach would only delete a VolumeAttachment, and the
// external-attacher lets one go only once it has unpublished the volume:
// with none in the API, nothing is attached on node-1, and the max wait
// for unmount protects nothing. The API is read; none there, the record
// goes at once and the pod on node-2 is woken. One there, the wait goes
// on. In-tree attachments, attachments whose object is seen, and healthy
// nodes wait as before.
func TestConfirmGoneInsteadOfTheMaxWait(t *testing.T) {
	inUse := func(info cache.NodeInfo) cache.NodeInfo {
		info.InUse = map[volume.Name]bool{specA.Name: true, specISCSI.Name: true}
		return info
	}
	notReady := inUse(cache.NodeInfo{Managed: true})
	unseen := cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI, AttachmentName: vaNameA}
	cfg := Config{MaxWaitForUnmount: 90 * time.Second}
	tests := []struct {
		name       string
		node       cache.NodeInfo
		deleted    bool
		attachment cache.Attachment
		listed     bool // node status lists it (recovered from there)
		settle     settleReply
		wantCalls  []string
		wantResult Result
		wantKept   bool
	}{
		{name: "not ready, none in the API: forgotten", node: notReady, attachment: unseen,
			settle: settleReply{res: Settled{Detached: true}}, wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1},
			wantResult: Result{Detached: true}},
		{name: "deleted, none in the API: forgotten", node: notReady, deleted: true, attachment: unseen,
			settle: settleReply{res: Settled{Detached: true}}, wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1},
			wantResult: Result{Detached: true}},
		{name: "known from node status alone, none in the API: forgotten, node status written again", node: notReady,
			attachment: cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI}, listed: true,
			settle: settleReply{res: Settled{Detached: true}}, wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1},
			wantResult: Result{Detached: true, WriteNodeStatus: true}},
		{name: "a detach started, its object gone: forgotten", node: notReady,
			attachment: cache.Attachment{Key: key(specA, node1), State: cache.Attached, Kind: volume.KindCSI, AttachmentName: vaNameA,
				Withdrawn: true, DetachWanted: t0, DetachStarted: t0},
			settle: settleReply{res: Settled{Detached: true}}, wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1},
			wantResult: Result{Detached: true}},
		{name: "one in the API: the max wait goes on", node: notReady, attachment: unseen,
			settle:    settleReply{res: Settled{Attached: true, UID: "uid-va"}},
			wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1}, wantResult: Result{RequeueAfter: 90 * time.Second}, wantKept: true},
		{name: "the API not answering: retried", node: notReady, attachment: unseen,
			settle:    settleReply{err: errors.New("connection refused")},
			wantCalls: []string{"csi settle " + string(specA.Name) + "@" + node1}, wantKept: true},
		{name: "its object seen: the max wait", node: notReady,
			attachment: cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI, AttachmentName: vaNameA, AttachmentUID: "uid-va"},
			wantResult: Result{RequeueAfter: 90 * time.Second}, wantKept: true},
		{name: "ready, in use: waits for the unmount", node: inUse(cache.NodeInfo{Managed: true, Ready: true}), attachment: unseen, wantKept: true},
		{name: "in-tree: the max wait", node: notReady,
			attachment: cache.Attachment{Key: cache.Key{Volume: specISCSI.Name, Node: node1}, State: cache.Uncertain, Kind: volume.KindInTree},
			wantResult: Result{RequeueAfter: 90 * time.Second}, wantKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, cfg)
			a := tt.attachment
			e.actual.Update(a.Key, true, func(cur *cache.Attachment) { *cur = a })
			if tt.listed {
				e.status.Recover(node1, []v1.AttachedVolume{{Name: v1.UniqueVolumeName(a.Volume)}})
			}
			e.actual.SetNode(node1, tt.node, time.Time{})
			if tt.deleted {
				e.actual.DeleteNode(node1, true, t0)
			}
			e.actual.SetNode(node2, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			e.desired.SetPod(podB, node2, []*volume.Spec{specA})
			e.settle[a.Volume] = tt.settle
			_, ctx := ktesting.NewTestContext(t)
			res, err := e.r.Sync(ctx, a.Key)
			if (err != nil) != (tt.settle.err != nil) {
				t.Errorf("error %v", err)
			}
			if !reflect.DeepEqual(e.calls, tt.wantCalls) {
				t.Errorf("mechanism calls %q, want %q", e.calls, tt.wantCalls)
			}
			if !reflect.DeepEqual(res, tt.wantResult) {
				t.Errorf("result %+v, want %+v", res, tt.wantResult)
			}
			if _, kept := e.actual.Get(a.Key); kept != tt.wantKept {
				t.Errorf("record kept: %v, want %v", kept, tt.wantKept)
			}
			if n := samples(t, e, "volume_detach", "success"); n != 0 {
				t.Errorf("%d detaches counted, want none: nothing was detached", n)
			}
		})
	}
}
