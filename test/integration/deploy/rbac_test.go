package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// usedInARace are the permissions the controller needs only when two
// events come in one order: the flow below may not use them, and is not
// failed for it.
var usedInARace = map[permission]string{
	{"storage.k8s.io", "volumeattachments", "get"}: "a VolumeAttachment the controller created, seen gone before its own event was read, is asked for before its record is dropped",
}

// TestLeastPrivilege runs the binary with the rendered Deployment's
// arguments and a token of the rendered ServiceAccount, bound to the rendered
// ClusterRole and Role, through an attach and a detach. The API server's
// audit log then proves the role exact: no request was refused, and every
// granted verb was used. The subtests remove one verb each and show the flow
// stopping where that verb is needed.
func TestLeastPrivilege(t *testing.T) {
	r := renderBase(t)
	// With the CSINodeInfo CRD served, its informer runs too.
	installCSINodeInfoCRD(t, r)
	kubeconfig := serviceAccountKubeconfig(t, r)
	t.Cleanup(func() {
		setClusterRole(t, r.clusterRole)
		setRole(t, r.role)
	})
	// A Lease left by another test would spare the controller its create.
	if err := cluster.Client.CoordinationV1().Leases(namespace).Delete(t.Context(), "attach-detach-controller", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}

	s := newScene(t, "rbac", "")
	offset := auditOffset(t)
	logRefusals(t, offset)
	c := startController(t, r, kubeconfig, nil)
	waitStarted(t, c)
	v := s.volume("full", "full-handle")
	s.createPod(v)
	s.waitAttached(v)
	s.waitReported(v, true)
	waitEventCount(t, s, v.name, "SuccessfulAttachVolume", 1)
	// A VolumeAttachment deleted behind the controller's back is created
	// again, and the repeated event is patched (its count), not created.
	va, err := s.attachment(v)
	if err != nil || va == nil {
		t.Fatalf("VolumeAttachment %s: %v", v.attachment, err)
	}
	if err := s.client.StorageV1().VolumeAttachments().Delete(s.ctx, v.attachment, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		again, err := s.attachment(v)
		return again != nil && again.UID != va.UID && again.Status.Attached, err
	}, "the VolumeAttachment created and attached again")
	waitEventCount(t, s, v.name, "SuccessfulAttachVolume", 2)
	s.deletePod(v)
	s.waitDetached(v)
	s.waitReported(v, false)
	stopController(t, c)
	lease, err := cluster.Client.CoordinationV1().Leases(namespace).Get(t.Context(), "attach-detach-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after SIGTERM: the release was not allowed", *h)
	}

	requests := controllerRequests(t, offset)

	// A VolumeAttachment of a node deleted while no controller ran: the
	// next start asks the API whether the node it names is gone.
	s.createAttachmentOnGoneNode(v)

	// Informers stream their initial list through a watch where the API
	// server can, and LIST where it can't: the same start with streaming
	// off uses list.
	offset = auditOffset(t)
	c = startController(t, r, kubeconfig, nil, "KUBE_FEATURE_WatchListClient=false")
	waitStarted(t, c)
	stopController(t, c)
	requests = append(requests, controllerRequests(t, offset)...)

	used := map[permission]int{}
	for _, e := range requests {
		if e.forbidden() {
			t.Errorf("refused: %s %s", e.Verb, e.RequestURI)
		}
		if p, ok := e.permission(); ok {
			used[p]++
		}
	}
	granted := map[permission]bool{}
	for _, p := range append(grants(r.clusterRole.Rules), grants(r.role.Rules)...) {
		granted[p] = true
		if used[p] == 0 {
			if why, ok := usedInARace[p]; ok {
				t.Logf("not used this time: %s (%s)", p, why)
				continue
			}
			t.Errorf("granted but never used: %s", p)
			continue
		}
		t.Logf("used %3d times: %s", used[p], p)
	}
	for p := range used {
		if !granted[p] {
			t.Errorf("used without a grant: %s", p)
		}
	}
	if t.Failed() {
		return
	}

	for _, tc := range []struct {
		name string
		perm permission
		// role: removed from the leader election Role, not the ClusterRole.
		role bool
		// refusals is how many refused requests to wait for: the
		// controller retried and was refused again.
		refusals int
		// flow drives what needs perm; it returns once the request is
		// refused and checks what did not happen.
		flow func(t *testing.T, s *scene, wait func())
	}{
		{
			name: "no VolumeAttachment create: nothing attaches",
			perm: permission{"storage.k8s.io", "volumeattachments", "create"}, refusals: 2,
			flow: func(t *testing.T, s *scene, wait func()) {
				v := s.volume("no-create", "no-create")
				s.createPod(v)
				wait()
				if va, err := s.attachment(v); err != nil || va != nil {
					t.Errorf("VolumeAttachment %s exists (%v) though its create was refused", v.attachment, err)
				}
			},
		},
		{
			name: "no node status patch: kubelet is never told",
			perm: permission{"", "nodes/status", "patch"}, refusals: 2,
			flow: func(t *testing.T, s *scene, wait func()) {
				v := s.volume("no-status", "no-status")
				s.createPod(v)
				s.waitAttached(v)
				wait()
				if got, err := s.reported(v.node); err != nil || slices.Contains(got, v.unique) {
					t.Errorf("node status lists %v (%v) though the patch was refused", got, err)
				}
			},
		},
		{
			name: "no VolumeAttachment delete: nothing detaches",
			perm: permission{"storage.k8s.io", "volumeattachments", "delete"}, refusals: 2,
			flow: func(t *testing.T, s *scene, wait func()) {
				v := s.volume("no-delete", "no-delete")
				s.createPod(v)
				s.waitAttached(v)
				s.waitReported(v, true)
				s.deletePod(v)
				wait()
				if va, err := s.attachment(v); err != nil || va == nil || va.DeletionTimestamp != nil {
					t.Errorf("VolumeAttachment %s gone or going (%v) though its delete was refused", v.attachment, err)
				}
			},
		},
		{
			name: "no event create: users see nothing",
			perm: permission{"", "events", "create"}, refusals: 1,
			flow: func(t *testing.T, s *scene, wait func()) {
				v := s.volume("no-events", "no-events")
				s.createPod(v)
				s.waitAttached(v)
				wait()
				if reasons, err := s.events(v.name); err != nil || len(reasons) > 0 {
					t.Errorf("pod %s has events %v (%v) though their create was refused", v.name, reasons, err)
				}
			},
		},
		{
			name: "no Lease update: no replica leads",
			perm: permission{"coordination.k8s.io", "leases", "update"}, role: true, refusals: 2,
			flow: func(t *testing.T, s *scene, wait func()) {
				v := s.volume("no-lease", "no-lease")
				s.createPod(v)
				wait()
				if va, err := s.attachment(v); err != nil || va != nil {
					t.Errorf("VolumeAttachment %s exists (%v) without a leader", v.attachment, err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.role {
				rules, ok := withoutVerb(r.role.Rules, tc.perm.resource, tc.perm.verb)
				if !ok {
					t.Fatalf("the Role does not grant %s", tc.perm)
				}
				setRole(t, &rbacv1.Role{ObjectMeta: r.role.ObjectMeta, Rules: rules})
				defer setRole(t, r.role)
			} else {
				rules, ok := withoutVerb(r.clusterRole.Rules, tc.perm.resource, tc.perm.verb)
				if !ok {
					t.Fatalf("the ClusterRole does not grant %s", tc.perm)
				}
				setClusterRole(t, &rbacv1.ClusterRole{ObjectMeta: r.clusterRole.ObjectMeta, Rules: rules})
				defer setClusterRole(t, r.clusterRole)
			}
			s := newScene(t, "rbac", "")
			offset := auditOffset(t)
			c := startController(t, r, kubeconfig, nil)
			if !tc.role {
				waitStarted(t, c)
			}
			wait := func() {
				t.Helper()
				framework.Eventually(t, waitTimeout, func() (bool, error) {
					return forbiddenCount(controllerRequests(t, offset), tc.perm) >= tc.refusals, nil
				}, "%d refused requests to %s", tc.refusals, tc.perm)
			}
			tc.flow(t, s, wait)
			if tc.role && strings.Contains(c.Output(), `"Became leader"`) {
				t.Errorf("became leader without the right to update the Lease")
			}
			stopController(t, c)
		})
	}
}

// waitEventCount waits until the pod's event of reason has counted n.
func waitEventCount(t *testing.T, s *scene, pod, reason string, n int32) {
	t.Helper()
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		list, err := s.client.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod, "reason": reason}.String(),
		})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Count >= n {
				return true, nil
			}
		}
		return false, nil
	}, "event %s on pod %s counted %d times", reason, pod, n)
}

// logRefusals logs, if the test fails, the controller's requests refused
// since offset: a role missing a verb shows up as a wait that times out.
func logRefusals(t *testing.T, offset int64) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, e := range controllerRequests(t, offset) {
			if e.forbidden() {
				t.Logf("refused: %s %s", e.Verb, e.RequestURI)
			}
		}
	})
}

// installCSINodeInfoCRD creates the rendered CSINodeInfo CRD and waits until
// it is served.
func installCSINodeInfoCRD(t *testing.T, r *rendered) {
	t.Helper()
	var doc strings.Builder
	for _, o := range r.objects {
		if o.GetKind() == "CustomResourceDefinition" {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			doc.Write(b)
			doc.WriteString("\n")
		}
	}
	if out, err := serverSideApply([]byte(doc.String()), false); err != nil {
		t.Fatalf("install CRD: %v\n%s", err, out)
	}
	if err := waitEstablished("csinodeinfos.csi.storage.k8s.io"); err != nil {
		t.Fatalf("wait for the CSINodeInfo CRD: %v", err)
	}
}

// createAttachmentOnGoneNode creates, for v's volume, an attached
// VolumeAttachment on a node that does not exist, deleted when the test
// ends.
func (s *scene) createAttachmentOnGoneNode(v volume) {
	s.t.Helper()
	pvc, err := s.client.CoreV1().PersistentVolumeClaims(s.ns).Get(s.ctx, v.name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	node := s.ns + "-gone"
	pv := pvc.Spec.VolumeName
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: framework.VolumeAttachmentName(v.handle, s.driver, node)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: s.driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if _, err := s.client.StorageV1().VolumeAttachments().Create(s.ctx, va, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		if err := s.client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			s.t.Errorf("delete VolumeAttachment %s: %v", va.Name, err)
		}
	})
}
