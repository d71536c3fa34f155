package reconciler

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	node1 = "node-1"
	node2 = "node-2"

	pendingReason = "CSINode node-1 not found: can't tell whether in-tree plugin kubernetes.io/aws-ebs is migrated"
	ebsInTree     = volume.Name("kubernetes.io/aws-ebs/vol-ebs")
	driverPending = "in-tree plugin kubernetes.io/aws-ebs is migrated on node node-1 but driver ebs.csi.aws.com is not installed"
	iscsiName     = volume.Name("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0")
)

var (
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	podA = cache.PodRef{Namespace: "default", Name: "pod-a", UID: "uid-a"}
	podB = cache.PodRef{Namespace: "default", Name: "pod-b", UID: "uid-b"}
	podC = cache.PodRef{Namespace: "other", Name: "pod-c", UID: "uid-c"}
	podD = cache.PodRef{Namespace: "third", Name: "pod-d", UID: "uid-d"}
	podE = cache.PodRef{Namespace: "default", Name: "pod-e", UID: "uid-e"}

	// specA is a ReadWriteOnce CSI volume, specB another one, specX a
	// ReadWriteMany one.
	specA = csiSpec("pv-a", "vol-a", true)
	specB = csiSpec("pv-b", "vol-b", true)
	specX = csiSpec("pv-x", "vol-x", false)
	// vaNameA names specA's VolumeAttachment on node-1.
	vaNameA = volume.AttachmentName("vol-a", specA.Driver, node1)
	// ebsCSI is the CSI name of the migratable EBS volume of specPending.
	ebsCSI      = volume.CSIName("ebs.csi.aws.com", "vol-ebs")
	specPending = &volume.Spec{
		Name: ebsInTree, Aliases: []volume.Name{ebsCSI}, PluginName: "kubernetes.io/aws-ebs",
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true,
		Pending: pendingReason,
	}
	// specPendingSince waits for its driver to register on a node whose
	// CSINode was created at t0.
	specPendingSince = &volume.Spec{
		Name: ebsInTree, Aliases: []volume.Name{ebsCSI}, PluginName: "kubernetes.io/aws-ebs",
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true,
		Pending: driverPending, PendingSince: t0,
	}
	specEBSInTree = &volume.Spec{
		Name: ebsInTree, Aliases: []volume.Name{ebsCSI}, Kind: volume.KindInTree, PluginName: "kubernetes.io/aws-ebs",
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true,
	}
	specISCSI = &volume.Spec{Name: iscsiName, Kind: volume.KindInTree, PluginName: volume.ISCSIPluginName, PVName: "pv-iscsi"}
)

func csiSpec(pv, handle string, singleNode bool) *volume.Spec {
	return &volume.Spec{
		Name: volume.CSIName("d.example.com", handle), Kind: volume.KindCSI, PluginName: volume.CSIPluginName,
		Driver: "d.example.com", VolumeHandle: handle, PVName: pv, SingleNode: singleNode,
	}
}

func key(s *volume.Spec, node string) cache.Key { return cache.Key{Volume: s.Name, Node: node} }

type attachReply struct {
	res AttachResult
	err error
	// seenAttached: the attachment is seen attached before Attach returns,
	// as the VolumeAttachment's informer can mark it.
	seenAttached bool
}

type detachReply struct {
	done bool
	err  error
}

type settleReply struct {
	res Settled
	err error
	// during, when set, runs inside the call (an informer event read
	// meanwhile).
	during func()
}

// fakeMechanism records its calls in a log shared by every mechanism and
// answers with the replies configured per volume.
type fakeMechanism struct {
	kind   volume.Kind
	calls  *[]string
	attach map[volume.Name]attachReply
	detach map[volume.Name]detachReply
	settle map[volume.Name]settleReply
	actual *cache.ActualState
	// during, when set, runs inside every Attach call.
	during func()
}

var _ Mechanism = (*fakeMechanism)(nil)

func (f *fakeMechanism) Attach(_ context.Context, spec *volume.Spec, node string) (AttachResult, error) {
	*f.calls = append(*f.calls, string(f.kind)+" attach "+string(spec.Name)+"@"+node)
	r := f.attach[spec.Name]
	if f.during != nil {
		f.during()
	}
	if r.seenAttached {
		f.actual.Update(cache.Key{Volume: spec.Name, Node: node}, true, func(a *cache.Attachment) {
			a.Kind, a.AttachmentName, a.State = f.kind, r.res.AttachmentName, cache.Attached
		})
	}
	return r.res, r.err
}

func (f *fakeMechanism) Detach(_ context.Context, a cache.Attachment) (bool, error) {
	*f.calls = append(*f.calls, string(f.kind)+" detach "+string(a.Volume)+"@"+a.Node)
	r := f.detach[a.Volume]
	return r.done, r.err
}

func (f *fakeMechanism) Settle(_ context.Context, a cache.Attachment, _ *volume.Spec) (Settled, error) {
	*f.calls = append(*f.calls, string(f.kind)+" settle "+string(a.Volume)+"@"+a.Node)
	r := f.settle[a.Volume]
	if r.during != nil {
		r.during()
	}
	return r.res, r.err
}

type env struct {
	t       *testing.T
	desired *cache.DesiredState
	actual  *cache.ActualState
	// status is the node status record the reconciler reads.
	status *nodestatus.Record
	rec    *record.FakeRecorder
	m      *metrics.Metrics
	r      *Reconciler
	now    time.Time
	calls  []string
	attach map[volume.Name]attachReply
	detach map[volume.Name]detachReply
	settle map[volume.Name]settleReply
	// writing holds the list of a node status write begun by begin.
	writing map[string][]v1.AttachedVolume
}

func newEnv(t *testing.T, cfg Config) *env {
	e := &env{
		t:       t,
		desired: cache.NewDesiredState(),
		actual:  cache.NewActualState(),
		rec:     record.NewFakeRecorder(100),
		m:       metrics.New(),
		now:     t0,
		attach:  map[volume.Name]attachReply{},
		detach:  map[volume.Name]detachReply{},
		settle:  map[volume.Name]settleReply{},
		writing: map[string][]v1.AttachedVolume{},
	}
	e.status = nodestatus.NewRecord(e.actual)
	mechs := map[volume.Kind]Mechanism{}
	for _, kind := range []volume.Kind{volume.KindCSI, volume.KindInTree} {
		mechs[kind] = &fakeMechanism{kind: kind, calls: &e.calls, attach: e.attach, detach: e.detach, settle: e.settle, actual: e.actual}
	}
	e.r = New(e.desired, e.actual, e.status, mechs, e.rec, e.m, cfg)
	e.r.now = func() time.Time { return e.now }
	return e
}

// begin starts a node status write, as the node status writer does.
func (e *env) begin(node string) {
	list, changed := e.status.Begin(node)
	if !changed {
		e.t.Fatalf("Begin(%s): no change to write", node)
	}
	e.writing[node] = list
}

// end finishes the write begin started.
func (e *env) end(node string, ok bool) {
	e.status.End(node, e.writing[node], ok)
	delete(e.writing, node)
}

// writeStatus is a successful node status write.
func (e *env) writeStatus(node string) {
	e.begin(node)
	e.end(node, true)
}

func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// fixture is an attachment on record when a test starts, and whether its
// node's status lists it (the node status record).
type fixture struct {
	cache.Attachment
	Reported bool
}

// attView is what a test checks of an attachment.
type attView struct {
	State        cache.State
	Reported     bool // node status lists it (the node status record)
	Withdrawn    bool
	DetachWanted bool // a detach is wanted since some time
	Unannounced  bool // an attach was started and not announced yet
	DevicePath   string
	Name         string // AttachmentName
	AttachError  string
	DetachError  string
}

func (e *env) view(a cache.Attachment) attView {
	return attView{
		State: a.State, Reported: e.status.IsListed(a.Key), Withdrawn: a.Withdrawn, DetachWanted: !a.DetachWanted.IsZero(),
		Unannounced: !a.Announced(), DevicePath: a.DevicePath, Name: a.AttachmentName,
		AttachError: a.AttachError, DetachError: a.DetachError,
	}
}

type wants struct {
	pod   cache.PodRef
	node  string
	specs []*volume.Spec
}

type step struct {
	name    string
	advance time.Duration // the clock moves on before the step
	before  func(e *env)  // what happens outside the reconciler first
	key     cache.Key

	wantCalls       []string
	wantResult      Result
	wantErr         string // the whole error text; empty: no error
	wantAttachError bool   // the error wraps an *AttachError
	wantEvents      []string
}

func succeeded(pv string) string {
	return `Normal SuccessfulAttachVolume AttachVolume.Attach succeeded for volume "` + pv + `" `
}

func failed(pv, msg string) string {
	return `Warning FailedAttachVolume AttachVolume.Attach failed for volume "` + pv + `" : ` + msg
}

// waitingForDetach is the warning of a single-node volume held on another
// node, worded as kube-controller-manager v1.37 words it.
func waitingForDetach(pv, msg string) string {
	return `Warning FailedAttachVolume Waiting for detach for volume "` + pv + `" ` + msg
}

const exclusive = "Volume is already exclusively attached to one node, waiting on detach before it can be attached to another node"

// histogram reads storage_operation_duration_seconds for a CSI volume of
// d.example.com, not migrated.
func histogram(t *testing.T, e *env, operation, status string) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	h := e.m.OperationDuration.WithLabelValues("kubernetes.io/csi:d.example.com", operation, status, "false")
	if err := h.(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.Histogram
}

func samples(t *testing.T, e *env, operation, status string) uint64 {
	return histogram(t, e, operation, status).GetSampleCount()
}

const noAttacher = "in-tree plugin kubernetes.io/aws-ebs has no attacher in this build: install its CSI driver and migrate the node"

func TestSync(t *testing.T) {
	ready := cache.NodeInfo{Managed: true, Ready: true}
	mounted := func(info cache.NodeInfo, names ...volume.Name) cache.NodeInfo {
		info.InUse = map[volume.Name]bool{}
		for _, n := range names {
			info.InUse[n] = true
		}
		return info
	}
	attached := func(s *volume.Spec, node string, f func(*fixture)) fixture {
		a := fixture{Attachment: cache.Attachment{Key: key(s, node), State: cache.Attached, Kind: s.Kind, PluginName: s.PluginName, Spec: s}, Reported: true}
		if f != nil {
			f(&a)
		}
		return a
	}
	withdrawn := func(a *fixture) { a.Withdrawn, a.Reported, a.DetachWanted = true, false, t0 }

	tests := []struct {
		name        string
		cfg         *Config // nil: 6 min max wait for unmount
		nodes       map[string]cache.NodeInfo
		deleted     []string // nodes whose Node object is gone
		pods        []wants
		attachments []fixture
		attach      map[volume.Name]attachReply
		detach      map[volume.Name]detachReply
		settle      map[volume.Name]settleReply
		steps       []step

		wantActual       map[cache.Key]attView
		wantForced       map[string]float64 // by reason; absent: 0
		wantAttachErrors map[string]float64 // by plugin; no other plugin may count one
		check            func(t *testing.T, e *env)
	}{
		{
			name:   "attach",
			pods:   []wants{{podA, node1, []*volume.Spec{specA}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{Attached: true, AttachmentName: "csi-a"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-a")}},
				{name: "again: nothing", key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Name: "csi-a"}},
		},
		{
			name:   "in-tree attach with a device path",
			pods:   []wants{{podA, node1, []*volume.Spec{specISCSI}}},
			attach: map[volume.Name]attachReply{iscsiName: {res: AttachResult{Attached: true, DevicePath: "/dev/sdb"}}},
			steps: []step{
				{key: key(specISCSI, node1), wantCalls: []string{"in-tree attach " + string(iscsiName) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-iscsi")}},
			},
			wantActual: map[cache.Key]attView{key(specISCSI, node1): {State: cache.Attached, DevicePath: "/dev/sdb"}},
		},
		{
			name:   "csi attach completes later and is announced then",
			pods:   []wants{{podA, node1, []*volume.Spec{specA}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: "csi-a"}}},
			steps: []step{
				// Its object not seen yet: looked for again in a while.
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}, wantResult: Result{RequeueAfter: unseenRecheck}},
				{
					name:    "VolumeAttachment attached",
					advance: 3 * time.Second,
					before: func(e *env) {
						e.actual.Update(key(specA, node1), false, func(a *cache.Attachment) { a.State = cache.Attached })
					},
					key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-a")},
				},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Name: "csi-a"}},
			check: func(t *testing.T, e *env) {
				h := histogram(t, e, metrics.OperationAttach, metrics.StatusSuccess)
				if h.GetSampleCount() != 1 || h.GetSampleSum() != 3 {
					t.Errorf("attach duration: %d samples, sum %v; want 1 sample of 3s", h.GetSampleCount(), h.GetSampleSum())
				}
			},
		},
		{
			name:   "csi attach seen complete before Attach returns is announced at once",
			pods:   []wants{{podA, node1, []*volume.Spec{specA}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: "csi-a"}, seenAttached: true}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-a")}},
				{name: "the informer's re-queue: announced once", key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Name: "csi-a"}},
			check: func(t *testing.T, e *env) {
				if n := samples(t, e, metrics.OperationAttach, metrics.StatusSuccess); n != 1 {
					t.Errorf("attach successes observed: %d, want 1", n)
				}
			},
		},
		{
			name:        "attached already: nothing",
			pods:        []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, nil)},
			steps:       []step{{key: key(specA, node1)}},
			wantActual:  map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name:        "detach of an unmounted volume: withdraw, wait for the status write, detach",
			attachments: []fixture{attached(specA, node1, nil)},
			detach:      map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "withdraw", key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}},
				{name: "still reported", key: key(specA, node1)},
				{name: "status written", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			// A previous leader withdrew it, or the pod went before the
			// attach was ever reported: no status write will happen, so no
			// write's end re-queues the key.
			name:        "attached, not wanted, not in node status: withdraw and detach in one sync",
			attachments: []fixture{attached(specA, node1, func(a *fixture) { a.Reported = false })},
			detach:      map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true, Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name: "attached, not wanted, not in node status, write in flight: withdraw waits for the write",
			pods: []wants{{podA, node1, []*volume.Spec{specB}}},
			attachments: []fixture{
				attached(specA, node1, func(a *fixture) { a.Reported = false }),
				attached(specB, node1, func(a *fixture) { a.Reported = false }),
			},
			detach: map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "write begun", before: func(e *env) { e.begin(node1) }, key: key(specA, node1),
					wantResult: Result{WriteNodeStatus: true}},
				{name: "write done, listing it", before: func(e *env) { e.end(node1, true) }, key: key(specA, node1)},
				{name: "status written", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{key(specB, node1): {State: cache.Attached, Reported: true}},
		},
		{
			// The delete call failed before it landed (refused, or failed
			// on its way): the VolumeAttachment the API shows is not being
			// deleted. A pod wants the volume again on the node, whose
			// kubelet lists it in use already: the detach is not finished
			// (it would wait for that forever); the volume is attached as
			// before and listed again.
			name:  "detach failed before landing, wanted again on the node: attached and listed again",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			pods:  []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachWanted, a.DetachStarted = false, true, t0, t0
				a.AttachmentName, a.AttachmentUID, a.DetachError = vaNameA, "uid-1", "delete refused"
			})},
			settle: map[volume.Name]settleReply{specA.Name: {res: Settled{Attached: true, UID: "uid-1"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi settle " + string(specA.Name) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}},
				{name: "listed", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true, Name: vaNameA}},
		},
		{
			// Its delete raced another one: the object is gone. The
			// record goes, and the volume is attached anew.
			name:  "detach raced another delete, wanted again on the node: attached anew",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			pods:  []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachWanted, a.DetachStarted, a.AttachmentName = false, true, t0, t0, vaNameA
			})},
			settle: map[volume.Name]settleReply{specA.Name: {res: Settled{Detached: true}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: vaNameA, Created: true, UID: "uid-2"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi settle " + string(specA.Name) + "@node-1"},
					wantResult: Result{Detached: true}},
				{name: "attached anew", key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantResult: Result{RequeueAfter: unseenRecheck}},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Uncertain, Unannounced: true, Name: vaNameA}},
			check: func(t *testing.T, e *env) {
				if n := samples(t, e, metrics.OperationDetach, metrics.StatusSuccess); n != 1 {
					t.Errorf("detach successes observed: %d, want 1", n)
				}
			},
		},
		{
			// Its delete landed (its answer was lost) and an attacher's
			// finalizer holds the object: the detach is under way. The
			// volume is not listed again while it is; once the object is
			// gone (its informer's deletion), it is attached anew.
			name:  "delete landed, answer lost, object being deleted: waits for it to go, then attached anew",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			pods:  []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachWanted, a.DetachStarted = false, true, t0, t0
				a.AttachmentName, a.AttachmentUID, a.DetachError = vaNameA, "uid-1", "timeout"
			})},
			settle: map[volume.Name]settleReply{specA.Name: {res: Settled{Detaching: true, UID: "uid-1"}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: vaNameA, Created: true, UID: "uid-2"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi settle " + string(specA.Name) + "@node-1"}},
				{name: "still being deleted: waits, with no timer", advance: time.Hour, key: key(specA, node1)},
				{name: "gone", before: func(e *env) { e.actual.Delete(key(specA, node1)) }, key: key(specA, node1),
					wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}, wantResult: Result{RequeueAfter: unseenRecheck}},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Uncertain, Unannounced: true, Name: vaNameA}},
		},
		{
			// An informer event read while the API answered says more than
			// the answer (a delete that landed since): the answer is not
			// applied, and the key is decided again.
			name:  "settled while the record changed: decided again",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			pods:  []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachStarted, a.AttachmentName, a.AttachmentUID = false, true, t0, vaNameA, "uid-1"
			})},
			steps: []step{
				{name: "being deleted meanwhile", before: func(e *env) {
					e.settle[specA.Name] = settleReply{res: Settled{Attached: true, UID: "uid-1"}, during: func() {
						e.actual.Update(key(specA, node1), false, func(a *cache.Attachment) { a.State = cache.Detaching })
					}}
				}, key: key(specA, node1), wantCalls: []string{"csi settle " + string(specA.Name) + "@node-1"},
					wantResult: Result{Wake: []cache.Key{key(specA, node1)}}},
				{name: "detaching: waits", key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Detaching, Withdrawn: true, Name: vaNameA}},
		},
		{
			name:  "settle fails: retried with backoff, nothing changed",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			pods:  []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachStarted, a.AttachmentName = false, true, t0, vaNameA
			})},
			settle: map[volume.Name]settleReply{specA.Name: {err: errors.New("connection refused")}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi settle " + string(specA.Name) + "@node-1"},
					wantErr: "settle the detach of " + string(specA.Name) + " from node node-1: connection refused"},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Withdrawn: true, Name: vaNameA}},
		},
		{
			// Nothing shows what became of an in-tree detach: the volume
			// is attached again.
			name:  "in-tree detach of unknown outcome, wanted again on the node: attached again and listed",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, iscsiName)},
			pods:  []wants{{podA, node1, []*volume.Spec{specISCSI}}},
			attachments: []fixture{attached(specISCSI, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachStarted, a.DetachError, a.DevicePath = false, true, t0, "timeout", "/dev/sdb"
			})},
			settle: map[volume.Name]settleReply{iscsiName: {res: Settled{Attached: true, DevicePath: "/dev/sdc"}}},
			steps: []step{
				{key: key(specISCSI, node1), wantCalls: []string{"in-tree settle " + string(iscsiName) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}},
			},
			wantActual: map[cache.Key]attView{key(specISCSI, node1): {State: cache.Attached, DevicePath: "/dev/sdc"}},
		},
		{
			// Attaching it again could attach it to a second node.
			name:  "in-tree single-node detach of unknown outcome, held on another node: blocked",
			nodes: map[string]cache.NodeInfo{node1: mounted(ready, ebsInTree), node2: ready},
			pods:  []wants{{podA, node1, []*volume.Spec{specEBSInTree}}},
			attachments: []fixture{
				attached(specEBSInTree, node1, func(a *fixture) { a.Reported, a.Withdrawn, a.DetachStarted = false, true, t0 }),
				attached(specEBSInTree, node2, nil),
			},
			steps: []step{
				{key: key(specEBSInTree, node1), wantEvents: []string{waitingForDetach("pv-ebs", exclusive)}},
			},
			wantActual: map[cache.Key]attView{
				key(specEBSInTree, node1): {State: cache.Attached, Withdrawn: true},
				key(specEBSInTree, node2): {State: cache.Attached, Reported: true},
			},
		},
		{
			// No pod wants it: the detach that started is finished, under
			// the detach rules.
			name: "detach started, outcome unknown, not wanted: finished",
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				a.Reported, a.Withdrawn, a.DetachStarted = false, true, t0
			})},
			detach: map[volume.Name]detachReply{specA.Name: {done: false}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Detaching, Withdrawn: true, Name: vaNameA}},
		},
		{
			// Not listed, not withdrawn, a write in flight: it is marked
			// withdrawn, so that the end of that write re-queues it.
			name: "uncertain, unlisted, a write in flight: withdrawn, woken by the write's end",
			pods: []wants{{podB, node1, []*volume.Spec{specB}}},
			attachments: []fixture{
				{Attachment: cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI, Spec: specA}},
				attached(specB, node1, func(a *fixture) { a.Reported = false }),
			},
			detach: map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "write begun", before: func(e *env) { e.begin(node1) }, key: key(specA, node1),
					wantResult: Result{WriteNodeStatus: true}},
				{name: "write done", before: func(e *env) {
					if keys := e.status.End(node1, e.writing[node1], true); !slices.Contains(keys, key(specA, node1)) {
						e.t.Errorf("the end of the write re-queues %v, not the waiting key", keys)
					}
				}, key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{key(specB, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name:        "withdrawn but still reported: detach waits",
			attachments: []fixture{attached(specA, node1, func(a *fixture) { a.Withdrawn = true })},
			steps:       []step{{key: key(specA, node1)}, {advance: time.Hour, key: key(specA, node1)}},
			wantActual:  map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true, Withdrawn: true, DetachWanted: true}},
		},
		{
			name: "node status write in flight: detach waits for it",
			pods: []wants{{podA, node1, []*volume.Spec{specB}}},
			attachments: []fixture{
				attached(specA, node1, withdrawn),
				attached(specB, node1, func(a *fixture) { a.Reported = false }),
			},
			detach: map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "write begun", before: func(e *env) { e.begin(node1) }, key: key(specA, node1)},
				{name: "write done", before: func(e *env) { e.end(node1, true) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{key(specB, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name: "failed node status write: detach waits for a successful one",
			attachments: []fixture{
				attached(specA, node1, func(a *fixture) { a.Withdrawn = true }),
			},
			detach: map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "write failed", before: func(e *env) { e.begin(node1); e.end(node1, false) }, key: key(specA, node1)},
				{name: "write done", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name: "detach completes later",
			attachments: []fixture{attached(specA, node1, func(a *fixture) {
				withdrawn(a)
				a.AttachmentUID = "uid-va" // its object was seen: its deletion will be
			})},
			detach: map[volume.Name]detachReply{specA.Name: {done: false}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}},
				{name: "detaching: wait", key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Detaching, Withdrawn: true, DetachWanted: true, Name: vaNameA}},
		},
		{
			// Created and deleted before any event showed it: no event will
			// say it is gone, so each sync asks the API.
			name:        "detaching, its object never seen: the API is asked again",
			attachments: []fixture{attached(specA, node1, withdrawn)},
			detach:      map[volume.Name]detachReply{specA.Name: {done: false}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}},
				{name: "gone per the API", before: func(e *env) { e.detach[specA.Name] = detachReply{done: true} }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name:        "detach error is returned and recorded",
			attachments: []fixture{attached(specA, node1, withdrawn)},
			detach:      map[volume.Name]detachReply{specA.Name: {err: errors.New("rpc timeout")}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"},
					wantErr: "detach " + string(specA.Name) + " from node node-1: rpc timeout"},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Withdrawn: true, DetachWanted: true, DetachError: "rpc timeout", Name: vaNameA}},
		},
		{
			name: "recovered in-tree attachment is detached by the in-tree mechanism",
			attachments: []fixture{{Attachment: cache.Attachment{Key: cache.Key{Volume: iscsiName, Node: node1}, State: cache.Attached,
				Withdrawn: true, DetachWanted: t0}}},
			detach: map[volume.Name]detachReply{iscsiName: {done: true}},
			steps: []step{
				{key: cache.Key{Volume: iscsiName, Node: node1}, wantCalls: []string{"in-tree detach " + string(iscsiName) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name:        "mounted on a Ready node: detach waits with no timer",
			nodes:       map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			attachments: []fixture{attached(specA, node1, nil)},
			steps: []step{
				{key: key(specA, node1)},
				{advance: time.Hour, key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true, DetachWanted: true}},
		},
		{
			name:        "mounted on a node not Ready: forced detach after the max wait",
			nodes:       map[string]cache.NodeInfo{node1: mounted(cache.NodeInfo{Managed: true}, specA.Name)},
			attachments: []fixture{attached(specA, node1, nil)},
			detach:      map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{key: key(specA, node1), wantResult: Result{RequeueAfter: 6 * time.Minute}},
				{advance: 2 * time.Minute, key: key(specA, node1), wantResult: Result{RequeueAfter: 4 * time.Minute}},
				{name: "withdraw", advance: 4 * time.Minute, key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}},
				{name: "status written", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
			wantForced: map[string]float64{ForceTimeout: 1},
		},
		{
			name:        "mounted on a node not Ready, force detach on timeout disabled: waits",
			cfg:         &Config{MaxWaitForUnmount: 6 * time.Minute, DisableForceDetachOnTimeout: true},
			nodes:       map[string]cache.NodeInfo{node1: mounted(cache.NodeInfo{Managed: true}, specA.Name)},
			attachments: []fixture{attached(specA, node1, nil)},
			steps: []step{
				{key: key(specA, node1)},
				{advance: time.Hour, key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true, DetachWanted: true}},
		},
		{
			name:        "mounted on a deleted node: forced detach after the max wait",
			nodes:       map[string]cache.NodeInfo{node1: mounted(ready, specA.Name)},
			deleted:     []string{node1},
			attachments: []fixture{attached(specA, node1, nil)},
			detach:      map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{key: key(specA, node1), wantResult: Result{RequeueAfter: 6 * time.Minute}},
				{name: "withdraw", advance: 6 * time.Minute, key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}},
				{name: "status written", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
			wantForced: map[string]float64{ForceTimeout: 1},
		},
		{
			name: "out-of-service node: detached at once though mounted and Ready",
			nodes: map[string]cache.NodeInfo{node1: mounted(cache.NodeInfo{Managed: true, Ready: true, OutOfService: true},
				specA.Name)},
			attachments: []fixture{attached(specA, node1, nil)},
			detach:      map[volume.Name]detachReply{specA.Name: {done: true}},
			steps: []step{
				{name: "withdraw", key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}},
				{name: "status written", before: func(e *env) { e.writeStatus(node1) }, key: key(specA, node1),
					wantCalls: []string{"csi detach " + string(specA.Name) + "@node-1"}, wantResult: Result{Detached: true}},
			},
			wantActual: map[cache.Key]attView{},
			wantForced: map[string]float64{ForceOutOfService: 1},
		},
		{
			name:        "RWO attached to another node no pod wants it on: waiting-for-detach warning once, attach after the detach",
			nodes:       map[string]cache.NodeInfo{node1: mounted(ready, specA.Name), node2: ready},
			pods:        []wants{{podB, node2, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, nil)},
			attach:      map[volume.Name]attachReply{specA.Name: {res: AttachResult{Attached: true}}},
			steps: []step{
				// Byte for byte what kube-controller-manager v1.37 posts.
				{key: key(specA, node2), wantEvents: []string{`Warning FailedAttachVolume Waiting for detach for volume "pv-a" ` +
					`Volume is already exclusively attached to one node, waiting on detach before it can be attached to another node`}},
				{name: "told once", key: key(specA, node2)},
				{name: "detached from node-1", before: func(e *env) { e.actual.Delete(key(specA, node1)) }, key: key(specA, node2),
					wantCalls:  []string{"csi attach " + string(specA.Name) + "@node-2"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-a")}},
			},
			wantActual: map[cache.Key]attView{key(specA, node2): {State: cache.Attached}},
		},
		{
			name:  "RWO used by pods on another node: the waiting-for-detach warning names them, per namespace",
			nodes: map[string]cache.NodeInfo{node1: ready, node2: ready},
			pods: []wants{
				{podA, node1, []*volume.Spec{specA}}, {podC, node1, []*volume.Spec{specA}}, {podE, node1, []*volume.Spec{specA}},
				{podB, node2, []*volume.Spec{specA}}, {podD, node2, []*volume.Spec{specA}},
			},
			attachments: []fixture{attached(specA, node1, nil)},
			steps: []step{
				{key: key(specA, node2), wantEvents: []string{
					waitingForDetach("pv-a", "Volume is already used by pod(s) pod-a, pod-e and 1 pod(s) in different namespaces"),
					waitingForDetach("pv-a", "Volume is already used by 3 pod(s) in different namespaces"),
				}},
				{name: "told once", key: key(specA, node2)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name:        "RWO: the waiting pod is told once, though the wording changes while the other node detaches",
			nodes:       map[string]cache.NodeInfo{node1: mounted(ready, specA.Name), node2: ready},
			pods:        []wants{{podA, node1, []*volume.Spec{specA}}, {podB, node2, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, nil)},
			steps: []step{
				{key: key(specA, node2), wantEvents: []string{waitingForDetach("pv-a", "Volume is already used by pod(s) pod-a")}},
				{name: "pod-a gone, node-1 still attached: not told again",
					before: func(e *env) { e.desired.SetPod(podA, node1, nil) }, key: key(specA, node2)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name:  "RWO uncertain on another node under its alias: blocked",
			nodes: map[string]cache.NodeInfo{node1: ready, node2: ready},
			pods: []wants{{podB, node2, []*volume.Spec{{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI,
				Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true, Migrated: true}}}},
			attachments: []fixture{{Attachment: cache.Attachment{Key: cache.Key{Volume: ebsInTree, Node: node1}, State: cache.Uncertain, Kind: volume.KindInTree}}},
			steps: []step{
				{key: cache.Key{Volume: ebsCSI, Node: node2}, wantEvents: []string{waitingForDetach("pv-ebs", exclusive)}},
			},
			wantActual: map[cache.Key]attView{{Volume: ebsInTree, Node: node1}: {State: cache.Uncertain}},
		},
		{
			name:        "RWX on two nodes: both attached",
			pods:        []wants{{podA, node1, []*volume.Spec{specX}}, {podB, node2, []*volume.Spec{specX}}},
			attachments: []fixture{attached(specX, node1, nil)},
			attach:      map[volume.Name]attachReply{specX.Name: {res: AttachResult{Attached: true}}},
			steps: []step{
				{key: key(specX, node2), wantCalls: []string{"csi attach " + string(specX.Name) + "@node-2"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-x")}},
			},
			wantActual: map[cache.Key]attView{
				key(specX, node1): {State: cache.Attached, Reported: true},
				key(specX, node2): {State: cache.Attached},
			},
		},
		{
			name: "uncertain attach is checked again, not announced",
			pods: []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{{Attachment: cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI,
				AttachmentName: "csi-a"}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: "csi-a"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}, wantResult: Result{RequeueAfter: unseenRecheck}},
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}, wantResult: Result{RequeueAfter: unseenRecheck}},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Uncertain, Unannounced: true, Name: "csi-a"}},
		},
		{
			// No external-attacher serves the driver: the object is seen,
			// never attached, no error. The pod is told once, after
			// AttachTimeout, as kube-controller-manager tells it.
			name: "attach nobody acts on: warned after the attach timeout",
			pods: []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{{Attachment: cache.Attachment{Key: key(specA, node1), State: cache.Uncertain, Kind: volume.KindCSI,
				AttachmentName: "csi-a", AttachmentUID: "uid-a"}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: "csi-a"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}, wantResult: Result{RequeueAfter: AttachTimeout}},
				{name: "a minute later", advance: time.Minute, key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantResult: Result{RequeueAfter: time.Minute}},
				{name: "timed out", advance: time.Minute, key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantEvents: []string{failed("pv-a", "timed out waiting for external-attacher of d.example.com CSI driver to attach volume vol-a")}},
				{name: "told once", advance: time.Minute, key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"}},
			},
			check: func(t *testing.T, e *env) {
				if d := e.r.Decide(key(specA, node1), e.now); !strings.Contains(d.Reason, "attach in progress for 3m0s: timed out waiting for external-attacher of d.example.com CSI driver") {
					t.Errorf("decision %v, want the timeout in its reason", d)
				}
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Uncertain, Unannounced: true, Name: "csi-a"}},
		},
		{
			name:   "attach error: warned once per message, returned for backoff",
			pods:   []wants{{podA, node1, []*volume.Spec{specA}}},
			attach: map[volume.Name]attachReply{specA.Name: {res: AttachResult{AttachmentName: "csi-a"}, err: &AttachError{Message: "disk busy"}}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantErr: "attach " + string(specA.Name) + " to node node-1: disk busy", wantAttachError: true,
					wantEvents: []string{failed("pv-a", "disk busy")}},
				{name: "same error: no event", key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantErr: "attach " + string(specA.Name) + " to node node-1: disk busy", wantAttachError: true},
				{
					name: "another error: event",
					before: func(e *env) {
						e.attach[specA.Name] = attachReply{res: AttachResult{AttachmentName: "csi-a"}, err: &AttachError{Message: "quota exceeded"}}
					},
					key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantErr: "attach " + string(specA.Name) + " to node node-1: quota exceeded", wantAttachError: true,
					wantEvents: []string{failed("pv-a", "quota exceeded")},
				},
			},
			wantActual:       map[cache.Key]attView{key(specA, node1): {State: cache.Uncertain, Unannounced: true, Name: "csi-a", AttachError: "quota exceeded"}},
			wantAttachErrors: map[string]float64{"kubernetes.io/csi:d.example.com": 3},
			check: func(t *testing.T, e *env) {
				if got := samples(t, e, metrics.OperationAttach, metrics.StatusFailUnknown); got != 3 {
					t.Errorf("failed attach operations observed: %d, want 3", got)
				}
			},
		},
		{
			name: "in-tree plugin missing: nothing recorded as attached",
			pods: []wants{{podA, node1, []*volume.Spec{specEBSInTree}}},
			attach: map[volume.Name]attachReply{ebsInTree: {
				err: &NotAttachedError{Err: fmt.Errorf("node node-1: %w", &intree.NoAttacherError{Plugin: "kubernetes.io/aws-ebs"})}}},
			steps: []step{
				{key: key(specEBSInTree, node1), wantCalls: []string{"in-tree attach " + string(ebsInTree) + "@node-1"},
					wantErr:    "attach " + string(ebsInTree) + " to node node-1: node node-1: " + noAttacher,
					wantEvents: []string{failed("pv-ebs", "node node-1: "+noAttacher)}},
			},
			wantActual:       map[cache.Key]attView{},
			wantAttachErrors: map[string]float64{"kubernetes.io/aws-ebs": 1},
		},
		{
			name:   "attach error, then success",
			pods:   []wants{{podA, node1, []*volume.Spec{specA}}},
			attach: map[volume.Name]attachReply{specA.Name: {err: errors.New("apiserver down")}},
			steps: []step{
				{key: key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantErr: "attach " + string(specA.Name) + " to node node-1: apiserver down", wantEvents: []string{failed("pv-a", "apiserver down")}},
				{
					advance: time.Second,
					before:  func(e *env) { e.attach[specA.Name] = attachReply{res: AttachResult{Attached: true}} },
					key:     key(specA, node1), wantCalls: []string{"csi attach " + string(specA.Name) + "@node-1"},
					wantResult: Result{WriteNodeStatus: true}, wantEvents: []string{succeeded("pv-a")},
				},
			},
			wantActual:       map[cache.Key]attView{key(specA, node1): {State: cache.Attached}},
			wantAttachErrors: map[string]float64{"kubernetes.io/csi:d.example.com": 1},
		},
		{
			name:        "wanted again while withdrawn: reported again",
			pods:        []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, withdrawn)},
			steps: []step{
				{key: key(specA, node1), wantResult: Result{WriteNodeStatus: true}},
				{key: key(specA, node1)},
			},
			wantActual: map[cache.Key]attView{key(specA, node1): {State: cache.Attached}},
		},
		{
			name:        "wanted again while waiting for the unmount: max wait forgotten",
			pods:        []wants{{podA, node1, []*volume.Spec{specA}}},
			attachments: []fixture{attached(specA, node1, func(a *fixture) { a.DetachWanted = t0 })},
			steps:       []step{{key: key(specA, node1)}},
			wantActual:  map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name: "pending mechanism, nothing attached: blocked with an error and a warning",
			pods: []wants{{podA, node1, []*volume.Spec{specPending}}},
			steps: []step{
				{key: key(specPending, node1), wantErr: "volume " + string(ebsInTree) + " on node node-1: " + pendingReason,
					wantEvents: []string{failed("pv-ebs", pendingReason)}},
				{key: key(specPending, node1), wantErr: "volume " + string(ebsInTree) + " on node node-1: " + pendingReason},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name: "pending since the node's CSINode was created (its driver not registered yet): warned only once that lasts undecidedGrace",
			pods: []wants{{podA, node1, []*volume.Spec{specPendingSince}}},
			steps: []step{
				{key: key(specPendingSince, node1), wantErr: "volume " + string(ebsInTree) + " on node node-1: " + driverPending},
				{advance: undecidedGrace - time.Second, key: key(specPendingSince, node1), wantErr: "volume " + string(ebsInTree) + " on node node-1: " + driverPending},
				{advance: time.Second, key: key(specPendingSince, node1), wantErr: "volume " + string(ebsInTree) + " on node node-1: " + driverPending,
					wantEvents: []string{failed("pv-ebs", driverPending)}},
			},
			wantActual: map[cache.Key]attView{},
		},
		{
			name: "pending mechanism, alias attached on this node: nothing, alias kept",
			pods: []wants{{podA, node1, []*volume.Spec{specPending}}},
			attachments: []fixture{{Attachment: cache.Attachment{Key: cache.Key{Volume: ebsCSI, Node: node1}, State: cache.Attached, Kind: volume.KindCSI},
				Reported: true}},
			steps: []step{
				{key: key(specPending, node1)},
				{name: "the alias", key: cache.Key{Volume: ebsCSI, Node: node1}},
				{name: "the alias later", advance: time.Hour, key: cache.Key{Volume: ebsCSI, Node: node1}},
			},
			wantActual: map[cache.Key]attView{{Volume: ebsCSI, Node: node1}: {State: cache.Attached, Reported: true}},
		},
		{
			name: "pending mechanism, alias withdrawn on this node: reported again",
			pods: []wants{{podA, node1, []*volume.Spec{specPending}}},
			attachments: []fixture{{Attachment: cache.Attachment{Key: cache.Key{Volume: ebsCSI, Node: node1}, State: cache.Attached, Kind: volume.KindCSI,
				Withdrawn: true, DetachWanted: t0}}},
			steps: []step{
				{name: "the alias", key: cache.Key{Volume: ebsCSI, Node: node1}, wantResult: Result{WriteNodeStatus: true}},
			},
			wantActual: map[cache.Key]attView{{Volume: ebsCSI, Node: node1}: {State: cache.Attached}},
		},
		{
			name:        "node not managed: nothing",
			nodes:       map[string]cache.NodeInfo{node1: {Ready: true}},
			pods:        []wants{{podA, node1, []*volume.Spec{specB}}},
			attachments: []fixture{attached(specA, node1, nil)},
			steps:       []step{{key: key(specA, node1)}, {key: key(specB, node1)}},
			wantActual:  map[cache.Key]attView{key(specA, node1): {State: cache.Attached, Reported: true}},
		},
		{
			name: "detaching: wait, wanted or not",
			pods: []wants{{podB, node2, []*volume.Spec{specX}}},
			attachments: []fixture{
				{Attachment: cache.Attachment{Key: key(specA, node1), State: cache.Detaching, Withdrawn: true}},
				{Attachment: cache.Attachment{Key: key(specX, node2), State: cache.Detaching, Withdrawn: true}},
			},
			steps: []step{{key: key(specA, node1)}, {key: key(specX, node2)}},
			wantActual: map[cache.Key]attView{
				key(specA, node1): {State: cache.Detaching, Withdrawn: true, DetachWanted: true},
				key(specX, node2): {State: cache.Detaching, Withdrawn: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{MaxWaitForUnmount: 6 * time.Minute}
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			e := newEnv(t, cfg)
			for n, r := range tt.attach {
				e.attach[n] = r
			}
			for n, r := range tt.detach {
				e.detach[n] = r
			}
			for n, r := range tt.settle {
				e.settle[n] = r
			}
			nodes := tt.nodes
			if nodes == nil {
				nodes = map[string]cache.NodeInfo{node1: ready, node2: ready}
			}
			for name, info := range nodes {
				e.actual.SetNode(name, info, time.Time{})
			}
			for _, a := range tt.attachments {
				e.actual.Update(a.Key, true, func(at *cache.Attachment) { *at = a.Attachment })
				if a.Reported {
					e.status.Recover(a.Node, []v1.AttachedVolume{{Name: v1.UniqueVolumeName(a.Volume), DevicePath: a.DevicePath}})
				}
			}
			for _, name := range tt.deleted {
				e.actual.DeleteNode(name, true, time.Time{})
			}
			for _, w := range tt.pods {
				e.desired.SetPod(w.pod, w.node, w.specs)
			}
			_, ctx := ktesting.NewTestContext(t)

			for i, s := range tt.steps {
				e.now = e.now.Add(s.advance)
				if s.before != nil {
					s.before(e)
				}
				e.calls = nil
				res, err := e.r.Sync(ctx, s.key)
				what := s.name
				if what == "" {
					what = s.key.String()
				}
				if !reflect.DeepEqual(e.calls, s.wantCalls) {
					t.Errorf("step %d (%s): mechanism calls %q, want %q", i, what, e.calls, s.wantCalls)
				}
				if s.wantResult.Awaited == nil {
					// Checked where it is the point (TestRankThroughAMove).
					res.Awaited = nil
				}
				if !reflect.DeepEqual(res, s.wantResult) {
					t.Errorf("step %d (%s): result %+v, want %+v", i, what, res, s.wantResult)
				}
				gotErr := ""
				if err != nil {
					gotErr = err.Error()
				}
				if gotErr != s.wantErr {
					t.Errorf("step %d (%s): error %q, want %q", i, what, gotErr, s.wantErr)
				}
				var ae *AttachError
				if got := errors.As(err, &ae); got != s.wantAttachError {
					t.Errorf("step %d (%s): error wraps an AttachError: %v, want %v", i, what, got, s.wantAttachError)
				}
				if got := e.events(); !reflect.DeepEqual(got, s.wantEvents) {
					t.Errorf("step %d (%s): events %q, want %q", i, what, got, s.wantEvents)
				}
			}

			got := map[cache.Key]attView{}
			for _, a := range e.actual.Attachments() {
				got[a.Key] = e.view(a)
			}
			if !reflect.DeepEqual(got, tt.wantActual) {
				t.Errorf("actual state:\n got %+v\nwant %+v", got, tt.wantActual)
			}
			for _, reason := range []string{ForceTimeout, ForceOutOfService} {
				if got := testutil.ToFloat64(e.m.ForcedDetaches.WithLabelValues(reason)); got != tt.wantForced[reason] {
					t.Errorf("forced detaches{reason=%q} = %v, want %v", reason, got, tt.wantForced[reason])
				}
			}
			if got := testutil.CollectAndCount(e.m.AttachErrors); got != len(tt.wantAttachErrors) {
				t.Errorf("attach errors counted for %d plugins, want %v", got, tt.wantAttachErrors)
			}
			for plugin, want := range tt.wantAttachErrors {
				if got := testutil.ToFloat64(e.m.AttachErrors.WithLabelValues(plugin)); got != want {
					t.Errorf("attach errors{plugin_name=%q} = %v, want %v", plugin, got, want)
				}
			}
			if tt.check != nil {
				tt.check(t, e)
			}
		})
	}
}

func TestDecideReasons(t *testing.T) {
	// The reason is what an operator reads when asking why a volume is not
	// attached or detached; a few must name the obstacle.
	tests := []struct {
		name       string
		nodes      map[string]cache.NodeInfo
		pods       []wants
		attachment *cache.Attachment
		key        cache.Key
		wantAction Action
		wantReason string
	}{
		{
			name: "not managed", nodes: map[string]cache.NodeInfo{node1: {}}, key: key(specA, node1),
			wantAction: Nothing, wantReason: "node node-1 is not managed by this controller (no volumes.kubernetes.io/controller-managed-attach-detach annotation)",
		},
		{
			name: "multi-attach", pods: []wants{{podB, node2, []*volume.Spec{specA}}},
			attachment: &cache.Attachment{Key: key(specA, node1), State: cache.Attached}, key: key(specA, node2),
			wantAction: Blocked, wantReason: "volume is already exclusively attached to node node-1, waiting on detach before it can be attached to another node",
		},
		{
			name:       "mounted",
			nodes:      map[string]cache.NodeInfo{node1: {Managed: true, Ready: true, InUse: map[volume.Name]bool{specA.Name: true}}},
			attachment: &cache.Attachment{Key: key(specA, node1), State: cache.Attached}, key: key(specA, node1),
			wantAction: Wait, wantReason: "still mounted on node node-1 (in node.status.volumesInUse); waiting for kubelet to unmount it",
		},
		{
			name: "pending", pods: []wants{{podA, node1, []*volume.Spec{specPending}}}, key: key(specPending, node1),
			wantAction: Blocked, wantReason: pendingReason,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Config{MaxWaitForUnmount: time.Minute})
			nodes := tt.nodes
			if nodes == nil {
				nodes = map[string]cache.NodeInfo{node1: {Managed: true, Ready: true}, node2: {Managed: true, Ready: true}}
			}
			for n, info := range nodes {
				e.actual.SetNode(n, info, time.Time{})
			}
			if a := tt.attachment; a != nil {
				e.actual.Update(a.Key, true, func(at *cache.Attachment) { *at = *a })
			}
			for _, w := range tt.pods {
				e.desired.SetPod(w.pod, w.node, w.specs)
			}
			d := e.r.Decide(tt.key, t0)
			if d.Action != tt.wantAction || d.Reason != tt.wantReason {
				t.Errorf("Decide = %s: %q; want %s: %q", d.Action, d.Reason, tt.wantAction, tt.wantReason)
			}
			if !strings.HasPrefix(d.String(), string(tt.wantAction)+": ") {
				t.Errorf("String() = %q", d.String())
			}
		})
	}
}

// A handoff is not done while a Sync awaits an attach call's answer: what
// the call created is in no cache yet.
func TestSyncingCountsSyncsUnderWay(t *testing.T) {
	e := newEnv(t, Config{MaxWaitForUnmount: 6 * time.Minute})
	e.actual.SetNode(node1, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
	e.desired.SetPod(podA, node1, []*volume.Spec{specA})
	e.attach[specA.Name] = attachReply{res: AttachResult{AttachmentName: "csi-a"}}
	during := -1
	e.r.mechanisms[volume.KindCSI].(*fakeMechanism).during = func() { during = e.r.Syncing() }
	if _, err := e.r.Sync(context.Background(), key(specA, node1)); err != nil {
		t.Fatal(err)
	}
	if during != 1 || e.r.Syncing() != 0 {
		t.Errorf("Syncing: %d during the attach call, %d after; want 1 and 0", during, e.r.Syncing())
	}
}

// A node status write that only adds volumes waits for an attach call under
// way on the node, and the call's end queues it: the call may end with
// nothing to report (here: nothing attached) and nothing else to queue the
// write before its time is up.
func TestAttachCallHoldsNodeStatus(t *testing.T) {
	for _, tt := range []struct {
		name      string
		reply     attachReply
		wantErr   bool
		wantAfter time.Duration // Hold once the call ended
	}{
		{name: "nothing attached", reply: attachReply{err: &NotAttachedError{Err: errors.New("no attacher")}}, wantErr: true},
		{name: "attach failed", reply: attachReply{err: errors.New("refused")}, wantErr: true},
		// Under way until its VolumeAttachment is attached, whose informer
		// queues the write then.
		{name: "attach started", reply: attachReply{res: AttachResult{AttachmentName: "csi-a"}}, wantAfter: 900 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Config{MaxWaitForUnmount: 6 * time.Minute})
			e.actual.SetNode(node1, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			// B is attached and not in node status yet.
			e.actual.Update(key(specB, node1), true, func(a *cache.Attachment) { a.State, a.Spec = cache.Attached, specB })
			e.desired.SetPod(podA, node1, []*volume.Spec{specA})
			e.attach[specA.Name] = tt.reply
			var during time.Duration
			e.r.mechanisms[volume.KindCSI].(*fakeMechanism).during = func() { during = e.status.Hold(node1, t0, time.Second) }
			res, err := e.r.Sync(context.Background(), key(specA, node1))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Sync error %v, want one: %v", err, tt.wantErr)
			}
			if during != time.Second {
				t.Errorf("Hold during the attach call = %v, want 1s", during)
			}
			if !res.WriteNodeStatus {
				t.Errorf("result %+v: the end of the call does not queue the write that waits for it", res)
			}
			if got := e.status.Hold(node1, t0.Add(100*time.Millisecond), time.Second); got != tt.wantAfter {
				t.Errorf("Hold after the call = %v, want %v", got, tt.wantAfter)
			}
		})
	}
}
