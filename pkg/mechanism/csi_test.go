package mechanism

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	k8stesting "k8s.io/client-go/testing"
	clientcache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	driver = "d.example.com"
	handle = "vol-1"
	node   = "node-1"
)

// vaName is the upstream VolumeAttachment name, computed here on its own.
func vaName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

var name1 = vaName(handle, driver, node)

func pvSpec() *volume.Spec {
	return &volume.Spec{Name: volume.CSIName(driver, handle), Kind: volume.KindCSI, PluginName: volume.CSIPluginName,
		Driver: driver, VolumeHandle: handle, PVName: "pv-1"}
}

var inlineSpec = &v1.PersistentVolumeSpec{
	AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
	PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc", FSType: "ext4"}},
}

func migratedInline() *volume.Spec {
	return &volume.Spec{Name: volume.CSIName("ebs.csi.aws.com", "vol-abc"), Kind: volume.KindCSI, PluginName: "kubernetes.io/aws-ebs",
		Migrated: true, Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc", InlineSpec: inlineSpec,
		Inline: &v1.Volume{Name: "disk"}}
}

func va(name string, f func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	pv := "pv-1"
	a := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name[:8])},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if f != nil {
		f(a)
	}
	return a
}

// setup returns the mechanism over a fake clientset holding inAPI and a
// lister holding inCache (the informer may lag behind the API).
func setup(t *testing.T, inAPI, inCache []*storagev1.VolumeAttachment, reactors map[string]error) (*CSI, *fake.Clientset) {
	t.Helper()
	objs := make([]runtime.Object, 0, len(inAPI))
	for _, a := range inAPI {
		objs = append(objs, a)
	}
	client := fake.NewClientset(objs...)
	for verb, err := range reactors {
		client.PrependReactor(verb, "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, err
		})
	}
	indexer := clientcache.NewIndexer(clientcache.MetaNamespaceKeyFunc, clientcache.Indexers{})
	for _, a := range inCache {
		if err := indexer.Add(a); err != nil {
			t.Fatal(err)
		}
	}
	return NewCSI(client, storagelisters.NewVolumeAttachmentLister(indexer), nil), client
}

func TestCSIAttach(t *testing.T) {
	pv := "pv-1"
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	tests := []struct {
		name     string
		spec     *volume.Spec
		inAPI    []*storagev1.VolumeAttachment
		inCache  []*storagev1.VolumeAttachment
		reactors map[string]error

		want            reconciler.AttachResult
		wantErr         string
		wantAttachError bool
		wantCreated     *storagev1.VolumeAttachment // nil: no create call
		wantActions     int
	}{
		{
			name: "PV: creates the VolumeAttachment",
			spec: pvSpec(),
			want: reconciler.AttachResult{AttachmentName: name1, Created: true},
			wantCreated: &storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: name1},
				Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
					Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
			},
			wantActions: 1,
		},
		{
			name: "migrated inline volume: creates it with the translated spec",
			spec: migratedInline(),
			want: reconciler.AttachResult{AttachmentName: vaName("vol-abc", "ebs.csi.aws.com", node), Created: true},
			wantCreated: &storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: vaName("vol-abc", "ebs.csi.aws.com", node)},
				Spec: storagev1.VolumeAttachmentSpec{Attacher: "ebs.csi.aws.com", NodeName: node,
					Source: storagev1.VolumeAttachmentSource{InlineVolumeSpec: inlineSpec}},
			},
			wantActions: 1,
		},
		{
			name:        "already exists in the API though not in the cache: fine",
			spec:        pvSpec(),
			inAPI:       []*storagev1.VolumeAttachment{va(name1, nil)},
			want:        reconciler.AttachResult{AttachmentName: name1, Created: true},
			wantActions: 1,
		},
		{
			name:     "create fails",
			spec:     pvSpec(),
			reactors: map[string]error{"create": errors.New("etcd unavailable")},
			want:     reconciler.AttachResult{AttachmentName: name1, Created: true},
			wantErr:  "create VolumeAttachment " + name1 + ": etcd unavailable", wantActions: 1,
		},
		{
			name:    "attached: no API call",
			spec:    pvSpec(),
			inCache: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) { a.Status.Attached = true })},
			want:    reconciler.AttachResult{AttachmentName: name1, Attached: true},
		},
		{
			name:    "not attached yet: no API call",
			spec:    pvSpec(),
			inCache: []*storagev1.VolumeAttachment{va(name1, nil)},
			want:    reconciler.AttachResult{AttachmentName: name1},
		},
		{
			name: "attach error of the attacher",
			spec: pvSpec(),
			inCache: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) {
				a.Status.AttachError = &storagev1.VolumeError{Message: "rpc error: code = NotFound desc = disk not found"}
			})},
			want:    reconciler.AttachResult{AttachmentName: name1},
			wantErr: "rpc error: code = NotFound desc = disk not found", wantAttachError: true,
		},
		{
			name: "being deleted",
			spec: pvSpec(),
			inCache: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) {
				a.DeletionTimestamp = &now
				a.Status.Attached = true
			})},
			want:    reconciler.AttachResult{AttachmentName: name1},
			wantErr: "VolumeAttachment " + name1 + " is being deleted",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, client := setup(t, tt.inAPI, tt.inCache, tt.reactors)
			got, err := m.Attach(context.Background(), tt.spec, node)
			if got != tt.want {
				t.Errorf("Attach = %+v, want %+v", got, tt.want)
			}
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Errorf("error %q, want %q", gotErr, tt.wantErr)
			}
			var ae *reconciler.AttachError
			if errors.As(err, &ae) != tt.wantAttachError {
				t.Errorf("error %v is an AttachError: %v, want %v", err, !tt.wantAttachError, tt.wantAttachError)
			}
			actions := client.Actions()
			if len(actions) != tt.wantActions {
				t.Fatalf("API calls %v, want %d", actions, tt.wantActions)
			}
			if tt.wantCreated == nil {
				return
			}
			create, ok := actions[0].(k8stesting.CreateAction)
			if !ok || create.GetResource().Resource != "volumeattachments" {
				t.Fatalf("API call %v, want a VolumeAttachment create", actions[0])
			}
			if obj := create.GetObject().(*storagev1.VolumeAttachment); !reflect.DeepEqual(obj, tt.wantCreated) {
				t.Errorf("created %+v\nwant %+v", obj, tt.wantCreated)
			}
		})
	}
}

func TestCSIDetach(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	named := cache.Attachment{Key: cache.Key{Volume: volume.CSIName(driver, handle), Node: node}, Kind: volume.KindCSI, AttachmentName: name1}
	// recovered from node.status alone: the name is derived from the volume's.
	recovered := cache.Attachment{Key: cache.Key{Volume: volume.CSIName(driver, handle), Node: node}}
	deleting := va(name1, func(a *storagev1.VolumeAttachment) {
		a.DeletionTimestamp = &now
		a.Finalizers = []string{"external-attacher/d-example-com"}
	})
	tests := []struct {
		name       string
		attachment cache.Attachment
		inAPI      []*storagev1.VolumeAttachment
		inCache    []*storagev1.VolumeAttachment
		reactors   map[string]error

		wantDone    bool
		wantErr     string
		wantDeleted bool // a delete call with the UID precondition
		// wantBlindDelete: a delete call with no precondition (the cache
		// never saw the object, so its UID is unknown).
		wantBlindDelete bool
		wantGone        bool // the object is gone from the API
	}{
		{
			name:       "deletes with a UID precondition; not done until gone",
			attachment: named,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, nil)}, inCache: []*storagev1.VolumeAttachment{va(name1, nil)},
			wantDeleted: true, wantGone: true,
		},
		{
			name:       "name derived from the volume name",
			attachment: recovered,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, nil)}, inCache: []*storagev1.VolumeAttachment{va(name1, nil)},
			wantDeleted: true, wantGone: true,
		},
		{name: "in neither the cache nor the API: done after the API says so", attachment: named, wantDone: true, wantBlindDelete: true, wantGone: true},
		{
			// Created, and its event not seen yet: the cache is no proof.
			name:       "in the API, not yet in the cache: deleted, not done",
			attachment: named, inAPI: []*storagev1.VolumeAttachment{va(name1, nil)},
			wantBlindDelete: true, wantGone: true,
		},
		{
			name:       "gone from the API since the cache saw it: done",
			attachment: named, inCache: []*storagev1.VolumeAttachment{va(name1, nil)},
			wantDone: true, wantDeleted: true, wantGone: true,
		},
		{
			name:       "being deleted: not done, no call",
			attachment: named, inAPI: []*storagev1.VolumeAttachment{deleting}, inCache: []*storagev1.VolumeAttachment{deleting},
		},
		{
			name:       "being deleted with a detach error",
			attachment: named,
			inCache: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) {
				a.DeletionTimestamp = &now
				a.Status.DetachError = &storagev1.VolumeError{Message: "device busy"}
			})},
			wantErr: "VolumeAttachment " + name1 + ": device busy", wantGone: true,
		},
		{
			name:       "delete fails",
			attachment: named,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, nil)}, inCache: []*storagev1.VolumeAttachment{va(name1, nil)},
			reactors:    map[string]error{"delete": apierrors.NewConflict(storagev1.Resource("volumeattachments"), name1, errors.New("UID precondition failed"))},
			wantErr:     "delete VolumeAttachment " + name1 + ": Operation cannot be fulfilled on volumeattachments.storage.k8s.io \"" + name1 + "\": UID precondition failed",
			wantDeleted: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, client := setup(t, tt.inAPI, tt.inCache, tt.reactors)
			done, err := m.Detach(context.Background(), tt.attachment)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if done != tt.wantDone || gotErr != tt.wantErr {
				t.Errorf("Detach = %v, %q; want %v, %q", done, gotErr, tt.wantDone, tt.wantErr)
			}
			var deletes []k8stesting.DeleteActionImpl
			for _, a := range client.Actions() {
				if d, ok := a.(k8stesting.DeleteActionImpl); ok {
					deletes = append(deletes, d)
				} else {
					t.Errorf("unexpected API call %v", a)
				}
			}
			if tt.wantDeleted {
				if len(deletes) != 1 {
					t.Fatalf("deletes %v, want one", deletes)
				}
				d := deletes[0]
				wantUID := types.UID("uid-" + name1[:8])
				if d.GetName() != name1 || d.DeleteOptions.Preconditions == nil || d.DeleteOptions.Preconditions.UID == nil ||
					*d.DeleteOptions.Preconditions.UID != wantUID {
					t.Errorf("delete %s with %+v, want %s with UID precondition %s", d.GetName(), d.DeleteOptions, name1, wantUID)
				}
			} else if tt.wantBlindDelete {
				if len(deletes) != 1 || deletes[0].GetName() != name1 || deletes[0].DeleteOptions.Preconditions != nil {
					t.Errorf("deletes %v, want one of %s with no precondition", deletes, name1)
				}
			} else if len(deletes) != 0 {
				t.Errorf("deletes %v, want none", deletes)
			}
			_, err = client.StorageV1().VolumeAttachments().Get(context.Background(), name1, metav1.GetOptions{})
			if gone := apierrors.IsNotFound(err); gone != tt.wantGone {
				t.Errorf("VolumeAttachment gone: %v, want %v (get: %v)", gone, tt.wantGone, err)
			}
		})
	}
}

// A single-node volume is not attached while a VolumeAttachment of its
// PersistentVolume on another node is in the informer: the reconciler, which
// checks the attachments on record, may not have identified it. A volume
// that many nodes may attach, and an object the API said is gone, do not
// hold it.
func TestCSIAttachHeldByAVolumeAttachmentOnAnotherNode(t *testing.T) {
	elsewhere := va(vaName(handle, driver, "node-0"), func(a *storagev1.VolumeAttachment) { a.Spec.NodeName = "node-0" })
	ofPV := func(pv string) []string {
		if pv == "pv-1" {
			return []string{elsewhere.Name}
		}
		return nil
	}
	for _, tc := range []struct {
		name       string
		singleNode bool
		gone       bool
		wantHeld   bool
	}{
		{name: "single-node", singleNode: true, wantHeld: true},
		{name: "many nodes", singleNode: false},
		{name: "single-node, the other object gone per the API", singleNode: true, gone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, client := setup(t, nil, []*storagev1.VolumeAttachment{elsewhere}, nil)
			c.ofPV = ofPV
			if tc.gone {
				c.forget(elsewhere.Name, elsewhere.UID)
			}
			spec := pvSpec()
			spec.SingleNode = tc.singleNode
			_, err := c.Attach(context.Background(), spec, node)
			created := false
			for _, a := range client.Actions() {
				created = created || a.GetVerb() == "create"
			}
			if held := err != nil && strings.Contains(err.Error(), "may still be attached to node node-0"); held != tc.wantHeld || created == tc.wantHeld {
				t.Errorf("Attach: err %v, created %v; want held %v", err, created, tc.wantHeld)
			}
		})
	}
}

// After a delete of unknown outcome, the API says what became of the
// detach, not the informer's copy, which may predate the delete: gone,
// detached; being deleted, under way; there and not being deleted, the
// delete did not land. A copy the informer still shows of an object the
// API no longer has is taken as gone from then on.
func TestCSISettle(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	named := cache.Attachment{Key: cache.Key{Volume: volume.CSIName(driver, handle), Node: node}, Kind: volume.KindCSI, AttachmentName: name1}
	recovered := cache.Attachment{Key: cache.Key{Volume: volume.CSIName(driver, handle), Node: node}, Kind: volume.KindCSI}
	attached := func(a *storagev1.VolumeAttachment) { a.Status.Attached = true }
	uid := types.UID("uid-" + name1[:8])
	tests := []struct {
		name       string
		attachment cache.Attachment
		inAPI      []*storagev1.VolumeAttachment
		inCache    []*storagev1.VolumeAttachment
		reactors   map[string]error

		want        reconciler.Settled
		wantErr     string
		wantGoneUID types.UID // the informer's copy with this UID is taken as gone
	}{
		{
			name:       "delete failed before landing: attached",
			attachment: named,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, attached)}, inCache: []*storagev1.VolumeAttachment{va(name1, attached)},
			want: reconciler.Settled{Attached: true, UID: string(uid)},
		},
		{
			name:       "name derived from the volume name",
			attachment: recovered,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, attached)},
			want:       reconciler.Settled{Attached: true, UID: string(uid)},
		},
		{
			name:       "not attached yet, failing: its attach error",
			attachment: named,
			inAPI: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) {
				a.Status.AttachError = &storagev1.VolumeError{Message: "no such disk"}
			})},
			want: reconciler.Settled{UID: string(uid), Error: "no such disk"},
		},
		{
			// The delete raced another one, or landed and its answer was
			// lost; the informer still shows the object.
			name:       "gone from the API, still in the informer: detached, the copy taken as gone",
			attachment: named, inCache: []*storagev1.VolumeAttachment{va(name1, attached)},
			want: reconciler.Settled{Detached: true}, wantGoneUID: uid,
		},
		{
			name:       "being deleted (an attacher's finalizer holds it), the informer behind: detaching",
			attachment: named,
			inAPI: []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) {
				a.Status.Attached, a.DeletionTimestamp, a.Finalizers = true, &now, []string{"external-attacher/d-example-com"}
				a.Status.DetachError = &storagev1.VolumeError{Message: "device busy"}
			})},
			inCache: []*storagev1.VolumeAttachment{va(name1, attached)},
			want:    reconciler.Settled{Detaching: true, UID: string(uid), Error: "device busy"},
		},
		{
			name:       "created again by someone: the new object, the informer's copy of the old taken as gone",
			attachment: named,
			inAPI:      []*storagev1.VolumeAttachment{va(name1, func(a *storagev1.VolumeAttachment) { a.UID = "uid-new" })},
			inCache:    []*storagev1.VolumeAttachment{va(name1, attached)},
			want:       reconciler.Settled{UID: "uid-new"}, wantGoneUID: uid,
		},
		{
			name:       "the API not answering: an error",
			attachment: named, inCache: []*storagev1.VolumeAttachment{va(name1, attached)},
			reactors: map[string]error{"get": errors.New("connection refused")},
			wantErr:  "get VolumeAttachment " + name1 + ": connection refused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, client := setup(t, tt.inAPI, tt.inCache, tt.reactors)
			got, err := m.Settle(context.Background(), tt.attachment, pvSpec())
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if got != tt.want || gotErr != tt.wantErr {
				t.Errorf("Settle = %+v, %q; want %+v, %q", got, gotErr, tt.want, tt.wantErr)
			}
			for _, a := range client.Actions() {
				if a.GetVerb() != "get" {
					t.Errorf("API call %v: Settle only reads", a)
				}
			}
			if gone := m.Gone(name1, uid); gone != (tt.wantGoneUID == uid) {
				t.Errorf("the informer's copy taken as gone: %v, want %v", gone, tt.wantGoneUID == uid)
			}
		})
	}
}
