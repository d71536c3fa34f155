package controller_test

// Table tests of the controller's syncs (pod, node, VolumeAttachment) and of
// its recovery at start, through its informers' handlers and its queues, as
// the workers run them: each row is a cluster the controller recovers, the
// changes it then reads, and the API writes and events that must follow.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const maxWait = 6 * time.Minute

// syncEnv is a controller over synchronous informers, a fake API that
// answers writes, a fake clock that drives the queues' delays too, and a
// recorder of events.
type syncEnv struct {
	t      *testing.T
	ctx    context.Context
	clock  *clocktesting.FakeClock
	client *fake.Clientset
	ctrl   *controller.Controller
	rec    *record.FakeRecorder
	inf    struct{ pods, pvcs, pvs, nodes, csiNodes, csiDrivers, vas *syncInformer }
	queues queues
	rv     int
	// log holds the writes the API accepted; vas what it stores, and
	// pending the VolumeAttachment events its watch has yet to deliver.
	log     []string
	vas     map[string]bool
	pending []func()
}

func newSyncEnv(t *testing.T, objs ...k8sruntime.Object) *syncEnv {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &syncEnv{t: t, ctx: ctx, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		rec: record.NewFakeRecorder(100), queues: queues{}, rv: 100, vas: map[string]bool{}}
	e.client = &fake.Clientset{}
	e.client.AddReactor("*", "*", e.react)
	for _, p := range []**syncInformer{&e.inf.pods, &e.inf.pvcs, &e.inf.pvs, &e.inf.nodes, &e.inf.csiNodes, &e.inf.csiDrivers, &e.inf.vas} {
		*p = newSyncInformer()
	}
	c, err := controller.New(controller.Config{
		Client:        e.client,
		Recorder:      e.rec,
		Metrics:       metrics.New(),
		Reconciler:    reconciler.Config{MaxWaitForUnmount: maxWait},
		InTree:        intree.NewRegistry(),
		Workers:       1,
		StatusWorkers: 1,
		Clock:         e.clock,
		Informers: &controller.Informers{Pods: e.inf.pods, PVCs: e.inf.pvcs, PVs: e.inf.pvs, Nodes: e.inf.nodes,
			CSINodes: e.inf.csiNodes, CSIDrivers: e.inf.csiDrivers, VolumeAttachments: e.inf.vas},
		NewQueue:    e.queues.newQueue(e.clock),
		NewKeyQueue: e.queues.newKeyQueue(e.clock),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.ctrl = c
	attachRequired := true
	e.inf.csiDrivers.upsert(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: costDriver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attachRequired}})
	for _, o := range objs {
		e.upsert(o)
	}
	if err := c.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	e.drain()
	return e
}

// react answers the controller's writes as an apiserver would: a created
// VolumeAttachment as sent (AlreadyExists if it exists), a patched node
// status as the node in the informer with a new resourceVersion, a deleted
// VolumeAttachment gone at once (the external-attacher detached it). The
// watch delivers created and deleted VolumeAttachments at the next drain.
func (e *syncEnv) react(action k8stesting.Action) (bool, k8sruntime.Object, error) {
	e.rv++
	switch a := action.(type) {
	case k8stesting.CreateAction:
		va, ok := a.GetObject().(*storagev1.VolumeAttachment)
		if !ok {
			return true, a.GetObject(), nil
		}
		if e.vas[va.Name] {
			return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "volumeattachments"}, va.Name)
		}
		va = va.DeepCopy()
		va.ResourceVersion = fmt.Sprint(e.rv)
		e.vas[va.Name] = true
		e.log = append(e.log, "create volumeattachments "+va.Name)
		e.pending = append(e.pending, func() { e.inf.vas.upsert(va) })
		return true, va, nil
	case k8stesting.DeleteAction:
		name := a.GetName()
		if !e.vas[name] {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "volumeattachments"}, name)
		}
		delete(e.vas, name)
		e.log = append(e.log, "delete volumeattachments "+name)
		e.pending = append(e.pending, func() {
			if obj, ok, _ := e.inf.vas.indexer.GetByKey(name); ok {
				e.inf.vas.remove(obj)
			}
		})
		return true, nil, nil
	case k8stesting.PatchAction:
		obj, ok, _ := e.inf.nodes.indexer.GetByKey(a.GetName())
		if !ok {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, a.GetName())
		}
		n := obj.(*v1.Node).DeepCopy()
		n.ResourceVersion = fmt.Sprint(e.rv)
		e.log = append(e.log, "patch nodes/status "+a.GetName())
		return true, n, nil
	}
	return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: action.GetResource().Resource}, "")
}

func (e *syncEnv) upsert(o k8sruntime.Object) {
	switch o := o.(type) {
	case *v1.Pod:
		e.inf.pods.upsert(o)
	case *v1.PersistentVolumeClaim:
		e.inf.pvcs.upsert(o)
	case *v1.PersistentVolume:
		e.inf.pvs.upsert(o)
	case *v1.Node:
		e.inf.nodes.upsert(o)
	case *storagev1.VolumeAttachment:
		e.vas[o.Name] = true
		e.inf.vas.upsert(o)
	default:
		e.t.Fatalf("no informer for %T", o)
	}
}

func (e *syncEnv) remove(o k8sruntime.Object) {
	switch o := o.(type) {
	case *v1.Pod:
		e.inf.pods.remove(o)
	case *v1.PersistentVolumeClaim:
		e.inf.pvcs.remove(o)
	case *v1.PersistentVolume:
		e.inf.pvs.remove(o)
	case *v1.Node:
		e.inf.nodes.remove(o)
	case *storagev1.VolumeAttachment:
		delete(e.vas, o.Name)
		e.inf.vas.remove(o)
	default:
		e.t.Fatalf("no informer for %T", o)
	}
}

// drain runs what is queued, then what the clock's delays release.
func (e *syncEnv) drain() {
	for range 100 {
		progress := len(e.pending) > 0
		for len(e.pending) > 0 {
			deliver := e.pending[0]
			e.pending = e.pending[1:]
			deliver()
		}
		if e.queues.runQueued(e.ctx, e.ctrl) {
			progress = true
		}
		if !progress {
			return
		}
	}
	e.t.Fatal("the queues never emptied")
}

// step advances the clock, gives the queues' delay loops a moment to
// release what is due, and drains.
func (e *syncEnv) step(d time.Duration) {
	e.clock.Step(d)
	time.Sleep(50 * time.Millisecond)
	e.drain()
}

// writes returns the API writes accepted since the last call, as
// "verb resource[/subresource] name".
func (e *syncEnv) writes() []string {
	out := e.log
	e.log = nil
	return out
}

// events returns the events posted since the last call, as "Type Reason".
func (e *syncEnv) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			f := strings.Fields(ev)
			out = append(out, f[0]+" "+f[1])
		default:
			return out
		}
	}
}

// The cluster of the rows: nodes node-0 and node-1, managed and Ready;
// volume i is a CSI PV bound to claim c-pv-<i>.

func node(i int, mutate ...func(*v1.Node)) *v1.Node {
	n := costNode(i, false)
	for _, m := range mutate {
		m(n)
	}
	return n
}

func withVolumes(vols ...int) func(*v1.Node) {
	return func(n *v1.Node) {
		for _, v := range vols {
			n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: uniqueName(v)})
		}
	}
}

func inUse(vols ...int) func(*v1.Node) {
	return func(n *v1.Node) {
		for _, v := range vols {
			n.Status.VolumesInUse = append(n.Status.VolumesInUse, uniqueName(v))
		}
	}
}

func notReady(n *v1.Node) { n.Status.Conditions[0].Status = v1.ConditionFalse }

func outOfService(n *v1.Node) {
	n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "node.kubernetes.io/out-of-service", Effect: v1.TaintEffectNoExecute})
}

func unmanaged(n *v1.Node) { delete(n.Annotations, managedNodeLabel) }

func pod(i, nodeIdx int, mutate ...func(*v1.Pod)) *v1.Pod {
	p := costPod(i, nodeIdx, fmt.Sprintf("pod-%06d", i))
	p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func succeeded(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }

func deleting(stopped bool) func(*v1.Pod) {
	return func(p *v1.Pod) {
		now := metav1.Now()
		p.DeletionTimestamp = &now
		if stopped {
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}
		}
	}
}

func unscheduled(p *v1.Pod) { p.Spec.NodeName = "" }

func multiNode(pv *v1.PersistentVolume) {
	pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
}

func claimed(i int, mutate ...func(*v1.PersistentVolume)) []k8sruntime.Object {
	pv := costPV(i)
	for _, m := range mutate {
		m(pv)
	}
	return []k8sruntime.Object{pv, costPVC(i)}
}

func va(i, nodeIdx int, attached bool) *storagev1.VolumeAttachment {
	return costVA(i, nodeIdx, attached)
}

func vaName(i, nodeIdx int) string {
	return volume.AttachmentName(handle(i), costDriver, nodeName(nodeIdx))
}

func objects(groups ...any) []k8sruntime.Object {
	var out []k8sruntime.Object
	for _, g := range groups {
		switch g := g.(type) {
		case k8sruntime.Object:
			out = append(out, g)
		case []k8sruntime.Object:
			out = append(out, g...)
		}
	}
	return out
}

type syncRow struct {
	name string
	// cluster is what the controller recovers at start.
	cluster []k8sruntime.Object
	// startWrites and startEvents are what the recovery must write and post
	// (nil: nothing).
	startWrites []string
	// then changes the cluster after the start; nil: nothing.
	then func(e *syncEnv)
	// wantWrites and wantEvents follow then (nil: none).
	wantWrites []string
	wantEvents []string
}

func runRows(t *testing.T, rows []syncRow) {
	t.Helper()
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			e := newSyncEnv(t, r.cluster...)
			if got := e.writes(); !slices.Equal(got, r.startWrites) {
				t.Fatalf("writes at start:\n got %q\nwant %q", got, r.startWrites)
			}
			e.events()
			if r.then == nil {
				return
			}
			r.then(e)
			if got := e.writes(); !slices.Equal(got, r.wantWrites) {
				t.Errorf("writes:\n got %q\nwant %q", got, r.wantWrites)
			}
			if got := e.events(); !slices.Equal(got, r.wantEvents) {
				t.Errorf("events:\n got %q\nwant %q", got, r.wantEvents)
			}
		})
	}
}

// attachedVA is the external-attacher's answer to the VolumeAttachment of
// volume i on node n.
func attachedVA(i, n int) func(*syncEnv) {
	return func(e *syncEnv) { e.upsert(va(i, n, true)); e.drain() }
}

func TestSyncPod(t *testing.T) {
	attach0 := "create volumeattachments " + vaName(0, 0)
	report0 := "patch nodes/status " + nodeName(0)
	runRows(t, []syncRow{
		{name: "a scheduled pod gets its volume attached, then reported",
			cluster: objects(node(0), claimed(0)),
			then: func(e *syncEnv) {
				e.upsert(pod(0, 0))
				e.drain()
				attachedVA(0, 0)(e)
			},
			wantWrites: []string{attach0, report0},
			wantEvents: []string{"Normal SuccessfulAttachVolume"}},
		{name: "an unscheduled pod needs nothing",
			cluster: objects(node(0), claimed(0)),
			then:    func(e *syncEnv) { e.upsert(pod(0, 0, unscheduled)); e.drain() }},
		{name: "a pod on a node this controller does not manage needs nothing",
			cluster: objects(node(0, unmanaged), claimed(0)),
			then:    func(e *syncEnv) { e.upsert(pod(0, 0)); e.drain() }},
		{name: "a pod on a node not read yet waits for the node's add",
			cluster: objects(claimed(0)),
			then: func(e *syncEnv) {
				e.upsert(pod(0, 0))
				e.drain()
				if got := e.writes(); len(got) != 0 {
					e.t.Errorf("writes before the node is read: %q", got)
				}
				e.upsert(node(0))
				e.drain()
			},
			wantWrites: []string{attach0}},
		{name: "a pod whose claim is missing gets a warning and nothing attached",
			cluster:    objects(node(0), costPV(0)),
			then:       func(e *syncEnv) { e.upsert(pod(0, 0)); e.drain() },
			wantEvents: []string{"Warning FailedAttachVolume"}},
		{name: "a pod that succeeded releases its volume: withdrawn, then detached",
			cluster:     objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then:        func(e *syncEnv) { e.upsert(pod(0, 0, succeeded)); e.drain() },
			wantWrites:  []string{report0, "delete volumeattachments " + vaName(0, 0)},
			wantEvents:  nil,
			startWrites: nil},
		{name: "a deleting pod whose containers stopped releases its volume",
			cluster:    objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then:       func(e *syncEnv) { e.upsert(pod(0, 0, deleting(true))); e.drain() },
			wantWrites: []string{report0, "delete volumeattachments " + vaName(0, 0)}},
		{name: "a deleting pod whose containers still run keeps its volume",
			cluster: objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then:    func(e *syncEnv) { e.upsert(pod(0, 0, deleting(false))); e.drain() }},
		{name: "a live pod whose claim was deleted keeps its volume, with a warning",
			cluster: objects(node(0, withVolumes(0), inUse(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then: func(e *syncEnv) {
				e.remove(costPVC(0))
				e.drain()
				e.upsert(node(0, withVolumes(0), inUse(0), notReady))
				e.step(maxWait + time.Minute)
			},
			wantEvents: []string{"Warning VolumeKeptAttached"}},
		{name: "a ReadWriteOnce volume wanted on two nodes is attached to one, the other pod warned",
			cluster: objects(node(0), node(1), claimed(0)),
			then: func(e *syncEnv) {
				e.upsert(pod(0, 0))
				e.drain()
				second := costPod(0, 1, "pod-second")
				second.Name = "p-second"
				e.upsert(second)
				e.drain()
			},
			wantWrites: []string{attach0},
			wantEvents: []string{"Warning FailedAttachVolume"}},
		{name: "a ReadWriteMany volume wanted on two nodes is attached to both",
			cluster: objects(node(0), node(1), claimed(0, multiNode)),
			then: func(e *syncEnv) {
				e.upsert(pod(0, 0))
				second := costPod(0, 1, "pod-second")
				second.Name = "p-second"
				e.upsert(second)
				e.drain()
			},
			wantWrites: []string{attach0, "create volumeattachments " + vaName(0, 1)}},
	})
}

func TestSyncNode(t *testing.T) {
	detach0 := "delete volumeattachments " + vaName(0, 0)
	report0 := "patch nodes/status " + nodeName(0)
	mountedGone := objects(node(0, withVolumes(0), inUse(0)), claimed(0), va(0, 0, true))
	runRows(t, []syncRow{
		{name: "a volume no pod wants but mounted on a Ready node stays, however long",
			cluster: mountedGone,
			then:    func(e *syncEnv) { e.step(maxWait + time.Minute) }},
		{name: "unmounted, it is withdrawn from node status, then detached",
			cluster: mountedGone,
			then: func(e *syncEnv) {
				n := node(0, withVolumes(0))
				n.ResourceVersion = "1000"
				e.upsert(n)
				e.drain()
			},
			wantWrites: []string{report0, detach0}},
		{name: "mounted on a NotReady node, it is detached after the max wait for unmount",
			cluster: mountedGone,
			then: func(e *syncEnv) {
				n := node(0, withVolumes(0), inUse(0), notReady)
				n.ResourceVersion = "1000"
				e.upsert(n)
				e.step(maxWait - time.Minute)
				if got := e.writes(); len(got) != 0 {
					e.t.Errorf("writes before the max wait: %q", got)
				}
				e.step(2 * time.Minute)
			},
			wantWrites: []string{report0, detach0},
			wantEvents: nil},
		{name: "mounted on an out-of-service node, it is detached at once",
			cluster: mountedGone,
			then: func(e *syncEnv) {
				n := node(0, withVolumes(0), inUse(0), notReady, outOfService)
				n.ResourceVersion = "1000"
				e.upsert(n)
				e.drain()
			},
			wantWrites: []string{report0, detach0}},
		{name: "node status that lists another volume is rewritten",
			cluster: objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then: func(e *syncEnv) {
				n := node(0, withVolumes(0, 7))
				n.ResourceVersion = "1000"
				e.upsert(n)
				e.drain()
			},
			wantWrites: []string{report0}},
		{name: "a status older than the controller's own write is not read",
			cluster: objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then: func(e *syncEnv) {
				e.upsert(pod(0, 0, succeeded))
				e.drain()
				e.writes()
				stale := node(0, withVolumes(0))
				stale.ResourceVersion = "50"
				e.upsert(stale)
				e.drain()
			}},
	})
}

func TestSyncVolumeAttachment(t *testing.T) {
	report0 := "patch nodes/status " + nodeName(0)
	runRows(t, []syncRow{
		{name: "attached by the external-attacher: reported in node status",
			cluster:     objects(node(0), claimed(0), pod(0, 0), va(0, 0, false)),
			then:        attachedVA(0, 0),
			wantWrites:  []string{report0},
			wantEvents:  []string{"Normal SuccessfulAttachVolume"},
			startWrites: nil},
		{name: "an attach error is posted on the pod",
			cluster: objects(node(0), claimed(0), pod(0, 0), va(0, 0, false)),
			then: func(e *syncEnv) {
				v := va(0, 0, false)
				v.ResourceVersion = "7"
				v.Status.AttachError = &storagev1.VolumeError{Message: "disk busy"}
				e.upsert(v)
				e.drain()
			},
			wantEvents: []string{"Warning FailedAttachVolume"}},
		{name: "deleted by someone while a pod wants it: attached again",
			cluster: objects(node(0, withVolumes(0)), claimed(0), pod(0, 0), va(0, 0, true)),
			then: func(e *syncEnv) {
				e.remove(va(0, 0, true))
				e.drain()
			},
			wantWrites: []string{"create volumeattachments " + vaName(0, 0), report0}},
		{name: "an orphan appearing on a managed node, not in use, is detached",
			cluster: objects(node(0), claimed(0)),
			then: func(e *syncEnv) {
				e.upsert(va(0, 0, true))
				e.drain()
			},
			wantWrites: []string{"delete volumeattachments " + vaName(0, 0)}},
	})
}

func TestRecover(t *testing.T) {
	runRows(t, []syncRow{
		{name: "everything right: no write",
			cluster: objects(node(0, withVolumes(0, 1), inUse(0, 1)), claimed(0), claimed(1), pod(0, 0), pod(1, 0),
				va(0, 0, true), va(1, 0, true))},
		{name: "an orphan VolumeAttachment not in use is detached",
			cluster:     objects(node(0), claimed(0), va(0, 0, true)),
			startWrites: []string{"delete volumeattachments " + vaName(0, 0)}},
		{name: "an orphan VolumeAttachment the node has mounted is kept until unmounted",
			cluster: objects(node(0, withVolumes(0), inUse(0)), claimed(0), va(0, 0, true))},
		{name: "an attached volume missing from node status is reported",
			cluster:     objects(node(0), claimed(0), pod(0, 0), va(0, 0, true)),
			startWrites: []string{"patch nodes/status " + nodeName(0)}},
		{name: "a pod's volume attached nowhere is attached",
			cluster:     objects(node(0), claimed(0), pod(0, 0)),
			startWrites: []string{"create volumeattachments " + vaName(0, 0)}},
	})
}
