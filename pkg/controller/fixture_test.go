package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A fixture is one Controller over a fake clientset, with informers that are
// never started: their indexers are filled directly (load), the syncs are
// called directly, and the queues only record what was added to them.

const (
	ns     = "default"
	driver = "csi.example.com"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type fixture struct {
	t       *testing.T
	ctx     context.Context
	c       *Controller
	client  *fake.Clientset
	events  *record.FakeRecorder
	clock   *clocktesting.FakeClock
	queues  map[string]*testQueue[string]
	volumes *testQueue[cache.Key]
}

// newFixture returns a controller whose listers and fake clientset hold objs.
func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	return newFixtureWith(t, nil, objs...)
}

// newFixtureWith is newFixture with the configuration changed by configure.
func newFixtureWith(t *testing.T, configure func(*Config), objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{
		t:      t,
		ctx:    klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig())),
		client: fake.NewClientset(objs...),
		events: record.NewFakeRecorder(100),
		clock:  clocktesting.NewFakeClock(epoch),
		queues: map[string]*testQueue[string]{},
	}
	cfg := Config{
		Client:        f.client,
		Recorder:      f.events,
		Metrics:       metrics.New(),
		Reconciler:    reconciler.Config{MaxWaitForUnmount: 6 * time.Minute},
		InTree:        intree.NewRegistry(intree.ISCSI{}),
		Workers:       1,
		StatusWorkers: 1,
		Informers:     NewInformers(f.client, nil, false, nil),
		Clock:         f.clock,
		NewQueue: func(name string) workqueue.TypedRateLimitingInterface[string] {
			q := newTestQueue[string]()
			f.queues[name] = q
			return q
		},
		NewKeyQueue: func(name string) workqueue.TypedRateLimitingInterface[cache.Key] {
			f.volumes = newTestQueue[cache.Key]()
			return f.volumes
		},
	}
	if configure != nil {
		configure(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	f.load(objs...)
	return f
}

// load makes objs the whole content of the listers, trimmed as the informers
// trim them.
func (f *fixture) load(objs ...runtime.Object) {
	f.t.Helper()
	guardLoad(f.t, f, objs, throughTrim)
}

// reset forgets what was queued, posted and called so far.
func (f *fixture) reset() {
	for _, q := range f.queues {
		q.reset()
	}
	f.volumes.reset()
	f.takeEvents()
	f.client.ClearActions()
}

// drain runs the node, volume and node status queues until they are empty,
// as the workers would (timers are not fired).
func (f *fixture) drain() {
	f.t.Helper()
	for range 100 {
		worked := f.c.Process(f.ctx, QueueNodes)
		worked = f.c.Process(f.ctx, QueueVolumes) || worked
		worked = f.c.Process(f.ctx, QueueNodeStatus) || worked
		if !worked {
			return
		}
	}
	f.t.Fatalf("queues not drained after 100 rounds: volumes %v, status %v", f.volumes.pending(), f.queues[QueueNodeStatus].pending())
}

// desiredState lists the desired state, one "volume@node pods single=" line
// per key, sorted.
func (f *fixture) desiredState() []string {
	var out []string
	for _, k := range f.c.desired.Keys() {
		spec, pods, _ := f.c.desired.Get(k)
		var refs []string
		for _, p := range pods {
			refs = append(refs, p.String()+"("+p.UID+")")
		}
		out = append(out, fmt.Sprintf("%s@%s %s single=%v", k.Volume, k.Node, strings.Join(refs, ","), spec.SingleNode))
	}
	slices.Sort(out)
	return out
}

// actualState lists the attachments, one "volume@node state" line per key
// (with " reported" when node.status lists it, and the VolumeAttachment's
// error if any), sorted.
func (f *fixture) actualState() []string {
	var out []string
	for _, a := range f.c.actual.Attachments() {
		line := fmt.Sprintf("%s@%s %s", a.Volume, a.Node, a.State)
		if f.c.status.IsListed(a.Key) {
			line += " reported"
		}
		if a.AttachError != "" {
			line += " attachError=" + a.AttachError
		}
		if a.DetachError != "" {
			line += " detachError=" + a.DetachError
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

// nodeFacts describes what the actual state knows of a node.
func (f *fixture) nodeFacts(name string) string {
	n, ok := f.c.actual.Node(name)
	if !ok {
		return "unknown"
	}
	var facts []string
	for _, fact := range []struct {
		name string
		set  bool
	}{{"exists", n.Exists}, {"managed", n.Managed}, {"ready", n.Ready}, {"out-of-service", n.OutOfService}} {
		if fact.set {
			facts = append(facts, fact.name)
		}
	}
	var inUse []string
	for v, ok := range n.InUse {
		if ok {
			inUse = append(inUse, string(v))
		}
	}
	slices.Sort(inUse)
	return strings.Join(facts, ",") + " inUse=[" + strings.Join(inUse, ",") + "]"
}

// queued lists what was added to the named queue since the last reset.
func (f *fixture) queued(name string) []string {
	if name == QueueVolumes {
		return f.volumes.addedNames()
	}
	return f.queues[name].addedNames()
}

// takeEvents returns the events posted since the last call, in order.
func (f *fixture) takeEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// writes lists the API writes made since the last reset: "verb
// resource[/subresource] name".
func (f *fixture) writes() []string {
	var out []string
	for _, a := range f.client.Actions() {
		var name string
		switch a := a.(type) {
		case k8stesting.CreateAction: // updates too: same methods
			if o, ok := a.GetObject().(metav1.Object); ok {
				name = o.GetName()
			}
		case k8stesting.DeleteAction:
			name = a.GetName()
		case k8stesting.PatchAction:
			name = a.GetName()
		default:
			continue
		}
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		out = append(out, a.GetVerb()+" "+res+" "+name)
	}
	return out
}

func sameList(a, b []string) bool { return slices.Equal(a, b) || (len(a) == 0 && len(b) == 0) }

// testQueue records what is added to it and hands items out in order; Get
// on an empty queue reports a shut down queue, so Process returns at once.
type testQueue[T comparable] struct {
	items   []T
	dirty   map[T]bool
	added   map[T]bool
	after   map[T]time.Duration
	retries map[T]int
}

var _ workqueue.TypedRateLimitingInterface[string] = (*testQueue[string])(nil)

func newTestQueue[T comparable]() *testQueue[T] {
	q := &testQueue[T]{}
	q.reset()
	return q
}

func (q *testQueue[T]) reset() {
	q.items, q.dirty, q.added, q.after, q.retries = nil, map[T]bool{}, map[T]bool{}, map[T]time.Duration{}, map[T]int{}
}

func (q *testQueue[T]) Add(x T) {
	q.added[x] = true
	if !q.dirty[x] {
		q.dirty[x] = true
		q.items = append(q.items, x)
	}
}

func (q *testQueue[T]) Len() int { return len(q.items) }

func (q *testQueue[T]) Get() (T, bool) {
	var zero T
	if len(q.items) == 0 {
		return zero, true
	}
	x := q.items[0]
	q.items = q.items[1:]
	delete(q.dirty, x)
	return x, false
}

func (q *testQueue[T]) Done(T)                        {}
func (q *testQueue[T]) ShutDown()                     {}
func (q *testQueue[T]) ShutDownWithDrain()            {}
func (q *testQueue[T]) ShuttingDown() bool            { return false }
func (q *testQueue[T]) AddAfter(x T, d time.Duration) { q.after[x] = d }
func (q *testQueue[T]) AddRateLimited(x T)            { q.retries[x]++ }
func (q *testQueue[T]) Forget(x T)                    { delete(q.retries, x) }
func (q *testQueue[T]) NumRequeues(x T) int           { return q.retries[x] }
func (q *testQueue[T]) pending() []T                  { return slices.Clone(q.items) }
func (q *testQueue[T]) addedNames() []string          { return names(q.added) }
func names[T comparable, V any](m map[T]V) (out []string) {
	for x := range m {
		out = append(out, fmt.Sprint(x))
	}
	slices.Sort(out)
	return out
}

// Objects.

func csiName(handle string) string { return string(volume.CSIName(driver, handle)) }

func key(handle, node string) string {
	return fmt.Sprint(cache.Key{Volume: volume.CSIName(driver, handle), Node: node})
}

type nodeOpt func(*v1.Node)

func node(name string, opts ...nodeOpt) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "10",
			Annotations: map[string]string{managedAnnotation: "true"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func unmanaged(n *v1.Node) { delete(n.Annotations, managedAnnotation) }
func notReady(n *v1.Node)  { n.Status.Conditions[0].Status = v1.ConditionFalse }
func outOfService(n *v1.Node) {
	n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: outOfServiceTaint, Effect: v1.TaintEffectNoExecute})
}
func resourceVersion(rv string) nodeOpt { return func(n *v1.Node) { n.ResourceVersion = rv } }
func inUse(names ...string) nodeOpt {
	return func(n *v1.Node) {
		for _, v := range names {
			n.Status.VolumesInUse = append(n.Status.VolumesInUse, v1.UniqueVolumeName(v))
		}
	}
}
func listsAttached(names ...string) nodeOpt {
	return func(n *v1.Node) {
		for _, v := range names {
			n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(v)})
		}
	}
}

type podOpt func(*v1.Pod)

// pod is a running pod on node using claims (pod volumes named as the
// claims).
func pod(name, node string, claims ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{NodeName: node},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{
			{Name: "c", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}},
	}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: c, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

func withPod(p *v1.Pod, opts ...podOpt) *v1.Pod {
	for _, o := range opts {
		o(p)
	}
	return p
}

func phase(ph v1.PodPhase) podOpt { return func(p *v1.Pod) { p.Status.Phase = ph } }
func uid(u string) podOpt         { return func(p *v1.Pod) { p.UID = types.UID(u) } }
func deleting(p *v1.Pod) {
	ts := metav1.NewTime(epoch)
	p.DeletionTimestamp = &ts
}
func containersStopped(p *v1.Pod) {
	for i := range p.Status.ContainerStatuses {
		p.Status.ContainerStatuses[i].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}
	}
}
func inlineVolume(vol v1.Volume) podOpt {
	return func(p *v1.Pod) { p.Spec.Volumes = append(p.Spec.Volumes, vol) }
}

// claim is a claim bound to PV pv-<claim name>.
func claim(name string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-claim-" + name)},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: "pv-" + name},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
}

func unboundClaim(name string) *v1.PersistentVolumeClaim {
	c := claim(name)
	c.Spec.VolumeName = ""
	c.Status.Phase = v1.ClaimPending
	return c
}

// csiPV is the CSI PV pv-<claim> bound to claim, with volume handle handle.
func csiPV(claimName, handle string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	if len(modes) == 0 {
		modes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + claimName},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: modes,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle}},
			ClaimRef: &v1.ObjectReference{Namespace: ns, Name: claimName, UID: types.UID("uid-claim-" + claimName)},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
}

type vaOpt func(*storagev1.VolumeAttachment)

// va is the VolumeAttachment of PV pv-<claim> (handle) on node, attached.
func va(claimName, handle, node string, opts ...vaOpt) *storagev1.VolumeAttachment {
	pvName := "pv-" + claimName
	name := volume.AttachmentName(handle, driver, node)
	a := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

func notAttached(a *storagev1.VolumeAttachment) { a.Status.Attached = false }
func attachError(msg string) vaOpt {
	return func(a *storagev1.VolumeAttachment) {
		a.Status.Attached = false
		a.Status.AttachError = &storagev1.VolumeError{Message: msg}
	}
}
func vaDeleting(a *storagev1.VolumeAttachment) {
	ts := metav1.NewTime(epoch)
	a.DeletionTimestamp = &ts
	a.Finalizers = []string{"external-attacher/csi-example-com"}
}

// syncFirst runs the syncs the informers' first events bring: the node, the
// VolumeAttachments of handles on it, then the pods (keys "namespace/name").
func (f *fixture) syncFirst(node string, handles []string, pods ...string) {
	f.t.Helper()
	if err := f.c.syncNode(f.ctx, node); err != nil {
		f.t.Fatal(err)
	}
	for _, h := range handles {
		if err := f.c.syncAttachment(f.ctx, volume.AttachmentName(h, driver, node)); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, p := range pods {
		if err := f.c.syncPod(f.ctx, p); err != nil {
			f.t.Fatal(err)
		}
	}
	// A node whose facts waited for its pods to be read is queued by the
	// read of the last one.
	for f.c.Process(f.ctx, QueueNodes) {
	}
}

// checkNotUnwanted fails unless the attachment at k is neither withdrawn
// nor counting down its max wait for unmount: nothing took it as unwanted.
func (f *fixture) checkNotUnwanted(k cache.Key, when string) {
	f.t.Helper()
	if a, _ := f.c.actual.Get(k); a.Withdrawn || !a.DetachWanted.IsZero() {
		f.t.Errorf("%v %s: withdrawn %v, detach wanted since %v; want neither", k, when, a.Withdrawn, a.DetachWanted)
	}
}
