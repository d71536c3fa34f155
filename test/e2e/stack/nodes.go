package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// Nodes that go away, as a cluster sees them: a hollow node stopped
// (HollowNode.Stop, or StopKubelet for a partition that will heal) stops
// renewing its Lease; kube-controller-manager's node lifecycle controller
// marks it NotReady (Ready Unknown) after NodeLifecycle.MonitorGracePeriod,
// taints it node.kubernetes.io/unreachable and, per zone and at its
// eviction rate, NoExecute; the taint eviction controller then deletes its
// pods once their toleration ends. Nothing finishes those deletions (no
// kubelet), so the pods stay Terminating until the node returns, someone
// force-deletes them, or the operator taints the node out of service
// (OutOfServiceTaint) and the pod garbage collector force-deletes them.
//
// The helpers below read that story through the API (WaitNodeNotReady,
// WaitNodeTaint, WaitPodTerminating, WaitPodGone), write the operator's
// part of it (TaintNode, ForceDeletePod), record what was detached and when
// (DetachLog), and read kube-controller-manager's view of the zones and
// of its forced detaches from its log (ZoneStates, ForcedDetaches).

// OutOfServiceTaint is the taint an operator puts on a node shut down for
// good (non-graceful node shutdown): its pods are force-deleted and their
// volumes detached at once.
var OutOfServiceTaint = v1.Taint{Key: v1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}

// TaintNode adds taint to the node, as `kubectl taint` does; a taint of
// the same key and effect already there is left as it is.
func TaintNode(ctx context.Context, client kubernetes.Interface, node string, taint v1.Taint) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if hasTaint(n, taint.Key, taint.Effect) {
			return nil
		}
		n = n.DeepCopy()
		n.Spec.Taints = append(n.Spec.Taints, taint)
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("taint node %s %s:%s: %w", node, taint.Key, taint.Effect, err)
	}
	return nil
}

func hasTaint(n *v1.Node, key string, effect v1.TaintEffect) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == key && t.Effect == effect })
}

// WaitNodeNotReady waits until the node's Ready condition is no longer
// True: for a stopped kubelet, Unknown, written by the node lifecycle
// controller.
func WaitNodeNotReady(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration) error {
	var why string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("get node %s: %w", node, err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				why = "Ready " + string(c.Status)
				return c.Status != v1.ConditionTrue, nil
			}
		}
		why = "no Ready condition"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not NotReady (%s): %w", node, why, err)
	}
	return nil
}

// WaitNodeReady waits until the node's Ready condition is True.
func WaitNodeReady(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration) error {
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("get node %s: %w", node, err)
		}
		return slices.ContainsFunc(n.Status.Conditions, func(c v1.NodeCondition) bool {
			return c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
		}), nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready: %w", node, err)
	}
	return nil
}

// WaitNodeTaint waits until the node has a taint of key and effect, or,
// with present false, none.
func WaitNodeTaint(ctx context.Context, client kubernetes.Interface, node, key string, effect v1.TaintEffect, present bool, timeout time.Duration) error {
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("get node %s: %w", node, err)
		}
		return hasTaint(n, key, effect) == present, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: taint %s:%s present=%t: %w", node, key, effect, present, err)
	}
	return nil
}

// NodeTainted says whether the node has a taint of key and effect.
func NodeTainted(ctx context.Context, client kubernetes.Interface, node, key string, effect v1.TaintEffect) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", node, err)
	}
	return hasTaint(n, key, effect), nil
}

// ForceDeletePod deletes the pod at once, as `kubectl delete pod
// --grace-period=0 --force` does: what its kubelet had mounted stays
// mounted as far as the node's status says. uid, if set, is a
// precondition: a pod re-created under the name is left alone.
func ForceDeletePod(ctx context.Context, client kubernetes.Interface, ns, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, name, opts); err != nil {
		return fmt.Errorf("force delete pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// WaitPodTerminating waits until the pod of that uid is being deleted (its
// deletionTimestamp set: an eviction) and returns it.
func WaitPodTerminating(ctx context.Context, client kubernetes.Interface, ns, name string, uid types.UID, timeout time.Duration) (*v1.Pod, error) {
	var pod *v1.Pod
	var why string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return false, fmt.Errorf("pod %s/%s is gone, not Terminating", ns, name)
		case err != nil:
			return false, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
		case p.UID != uid:
			return false, fmt.Errorf("pod %s/%s was replaced, not Terminating", ns, name)
		case p.DeletionTimestamp == nil:
			why = "not being deleted, " + string(p.Status.Phase)
			return false, nil
		}
		pod = p
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s not Terminating (%s): %w", ns, name, why, err)
	}
	return pod, nil
}

// WaitPodGone waits until the pod of that uid no longer exists (deleted, or
// replaced by another of the same name).
func WaitPodGone(ctx context.Context, client kubernetes.Interface, ns, name string, uid types.UID, timeout time.Duration) error {
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
		}
		return p.UID != uid, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s (uid %s) still there: %w", ns, name, uid, err)
	}
	return nil
}

// ExplainVolume asks /explain about the volume (its unique name,
// kubernetes.io/csi/DRIVER^HANDLE) on node: what the controller will do
// with it, and why, even once no pod wants it. raw is the JSON as served.
func (c *Controller) ExplainVolume(ctx context.Context, volume, node string) (e Explanation, raw string, err error) {
	path := "/explain?" + url.Values{"volume": {volume}, "node": {node}}.Encode()
	body, code, err := c.get(ctx, path)
	if err != nil {
		return e, "", err
	}
	if code != http.StatusOK {
		return e, string(body), fmt.Errorf("get %s: status %d: %s", path, code, body)
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return e, string(body), fmt.Errorf("decode %s: %w", path, err)
	}
	return e, string(body), nil
}

// DetachKind is what a DetachEvent saw.
type DetachKind string

const (
	// DetachRequested: a VolumeAttachment's deletion started (its
	// deletionTimestamp set): the attach/detach controller decided to
	// detach.
	DetachRequested DetachKind = "VolumeAttachment deletion requested"
	// DetachDone: the VolumeAttachment is gone, the attacher has detached.
	DetachDone DetachKind = "VolumeAttachment gone"
	// Unlisted: the volume left the node's status.volumesAttached, which the
	// attach/detach controller writes before it detaches.
	Unlisted DetachKind = "dropped from volumesAttached"
)

// DetachEvent is one step of a detach, as the API showed it.
type DetachEvent struct {
	At   time.Time
	Kind DetachKind
	Node string
	// Volume is the PV's name (an inline volume: DRIVER^HANDLE, or the
	// unique name when no PV is known).
	Volume string
}

func (d DetachEvent) String() string {
	return fmt.Sprintf("%s %s: %s on %s", d.At.Format("15:04:05.000"), d.Volume, d.Kind, d.Node)
}

// DetachLog records, for as long as its context lives, every detach
// from the moment it started: each VolumeAttachment whose deletion starts
// and ends, each volume dropped from a node's volumesAttached. What it
// records is what a test asserts "nothing was detached" on, and when.
type DetachLog struct {
	mu sync.Mutex
	// deleting are the VolumeAttachments whose deletion was recorded.
	deleting map[string]bool
	// listed are the names each node's volumesAttached holds.
	listed map[string][]string
	// pvOfName maps a CSI volume's unique name to its PV.
	pvOfName map[string]string
	events   []DetachEvent
}

// LogDetaches starts a DetachLog and returns once its caches are
// synced: what exists then is its starting point. It stops when ctx ends.
func LogDetaches(ctx context.Context, client kubernetes.Interface) (*DetachLog, error) {
	w := &DetachLog{deleting: map[string]bool{}, listed: map[string][]string{}, pvOfName: map[string]string{}}
	factory := informers.NewSharedInformerFactory(client, 0)
	handlers := []watchHandler{
		{factory.Core().V1().PersistentVolumes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.pvSeen, UpdateFunc: func(_, o any) { w.pvSeen(o) },
		}},
		{factory.Storage().V1().VolumeAttachments().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.vaSeen, UpdateFunc: func(_, o any) { w.vaSeen(o) }, DeleteFunc: w.vaGone,
		}},
		{factory.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.nodeSeen, UpdateFunc: func(_, o any) { w.nodeSeen(o) },
		}},
	}
	if err := startWatch(ctx, factory, "detach log", handlers); err != nil {
		return nil, err
	}
	return w, nil
}

// Events are the detaches seen, in order, on any of nodes (every node when
// none is named) at or after since.
func (w *DetachLog) Events(since time.Time, nodes ...string) []DetachEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []DetachEvent
	for _, e := range w.events {
		if !e.At.Before(since) && (len(nodes) == 0 || slices.Contains(nodes, e.Node)) {
			out = append(out, e)
		}
	}
	return out
}

// First is the first event of kind for volume on node at or after since;
// ok is false when there is none yet.
func (w *DetachLog) First(kind DetachKind, volume, node string, since time.Time) (at time.Time, ok bool) {
	for _, e := range w.Events(since, node) {
		if e.Kind == kind && e.Volume == volume {
			return e.At, true
		}
	}
	return time.Time{}, false
}

func (w *DetachLog) record(kind DetachKind, node, volume string) {
	w.events = append(w.events, DetachEvent{At: time.Now(), Kind: kind, Node: node, Volume: volume})
}

func (w *DetachLog) pvSeen(obj any) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pvOfName["kubernetes.io/csi/"+pv.Spec.CSI.Driver+"^"+pv.Spec.CSI.VolumeHandle] = pv.Name
}

func (w *DetachLog) vaSeen(obj any) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.DeletionTimestamp == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.deleting[va.Name] {
		w.deleting[va.Name] = true
		w.record(DetachRequested, va.Spec.NodeName, vaVolume(va))
	}
}

func (w *DetachLog) vaGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.deleting[va.Name] {
		// Its deletion was not seen (a finalizer-free object goes at once).
		w.record(DetachRequested, va.Spec.NodeName, vaVolume(va))
	}
	delete(w.deleting, va.Name)
	w.record(DetachDone, va.Spec.NodeName, vaVolume(va))
}

func (w *DetachLog) nodeSeen(obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	names := make([]string, 0, len(node.Status.VolumesAttached))
	for _, a := range node.Status.VolumesAttached {
		names = append(names, string(a.Name))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, name := range w.listed[node.Name] {
		if !slices.Contains(names, name) {
			volume := name
			if pv, ok := w.pvOfName[name]; ok {
				volume = pv
			}
			w.record(Unlisted, node.Name, volume)
		}
	}
	w.listed[node.Name] = names
}

// ZoneState is a zone state kube-controller-manager's node lifecycle
// controller entered: Initial, Normal, PartialDisruption (at least 3 nodes
// and --unhealthy-zone-threshold of them not Ready: evictions slowed, or
// stopped in a zone of at most --large-cluster-size-threshold nodes) or
// FullDisruption (none Ready: evictions at the normal rate, unless every
// zone is so, when they all stop: "master disruption mode").
type ZoneState struct {
	At    time.Time
	Zone  string
	State string
}

var (
	zoneStateLine = regexp.MustCompile(`"Controller detected that zone is now in new state".* zone="([^"]*)" newState="([^"]*)"`)
	disruptionAll = regexp.MustCompile(`"Controller detected that (all Nodes are not-Ready\. Entering|some Nodes are Ready\. Exiting) master disruption mode"`)
	// klogHeader is the start of a klog text line: severity, month, day,
	// time of day (local time).
	klogHeader = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)
)

// ZoneStates reads, from kube-controller-manager's log, each zone state
// its node lifecycle controller entered, in order; "(all zones)" stands
// for its master disruption mode (every zone FullDisruption: no eviction
// anywhere) entered ("FullDisruption") or left ("Normal"). A zone is named
// by its topology.kubernetes.io/zone label (the controller's key is
// "REGION:\x00:ZONE").
func ZoneStates(log string) []ZoneState {
	var out []ZoneState
	for line := range strings.Lines(log) {
		if m := zoneStateLine.FindStringSubmatch(line); m != nil {
			zone := m[1]
			if i := strings.LastIndex(zone, ":"); i >= 0 {
				zone = zone[i+1:]
			}
			out = append(out, ZoneState{At: klogTime(line), Zone: zone, State: m[2]})
		}
		if m := disruptionAll.FindStringSubmatch(line); m != nil {
			state := "FullDisruption"
			if strings.HasPrefix(m[1], "some") {
				state = "Normal"
			}
			out = append(out, ZoneState{At: klogTime(line), Zone: "(all zones)", State: state})
		}
	}
	return out
}

// ForcedDetach is a detach of a volume still mounted that
// kube-controller-manager's attachdetach controller logged.
type ForcedDetach struct {
	At     time.Time
	Node   string
	Volume string
	// Reason is "timeout" (the max wait for unmount, 6 minutes, passed on
	// an unhealthy node) or "out-of-service".
	Reason string
}

var forcedDetachLine = regexp.MustCompile(`"attacherDetacher\.DetachVolume started: (this volume is not safe to detach, but maxWaitForUnmountDuration expired|node has out-of-service taint), force detaching".* node="([^"]*)" volumeName="([^"]*)"`)

// ForcedDetaches reads kube-controller-manager's forced detaches from its
// log, in order.
func ForcedDetaches(log string) []ForcedDetach {
	var out []ForcedDetach
	for line := range strings.Lines(log) {
		m := forcedDetachLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		reason := "timeout"
		if strings.HasPrefix(m[1], "node has") {
			reason = "out-of-service"
		}
		out = append(out, ForcedDetach{At: klogTime(line), Node: m[2], Volume: m[3], Reason: reason})
	}
	return out
}

// klogTime is the time a klog text line was written, this year; zero if
// the line has no header.
func klogTime(line string) time.Time {
	m := klogHeader.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}
	}
	now := time.Now()
	t, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return time.Time{}
	}
	t = t.AddDate(now.Year(), 0, 0)
	if t.After(now.Add(24 * time.Hour)) {
		// Written last year, read after New Year.
		t = t.AddDate(-1, 0, 0)
	}
	return t
}
