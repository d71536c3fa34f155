package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const managedAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// syncPod turns one pod into desired state: the volumes it needs attached to
// its node. A pod that is gone, unscheduled or terminated needs nothing.
func (c *Controller) syncPod(ctx context.Context, key string) error {
	touched, err := c.readPod(ctx, key)
	c.touch(touched...)
	return err
}

// readPod brings what the pod at key wants into the desired state and
// returns the keys that changed, for the caller to queue. What a pod wants
// is recorded whatever its node: managed or not, known or not; Decide asks
// the node's facts whether it counts.
func (c *Controller) readPod(ctx context.Context, key string) ([]cache.Key, error) {
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forgetProblems(key)
		return c.desired.DeletePod(key), nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s: %w", key, err)
	}
	node := pod.Spec.NodeName
	if node == "" || podTerminated(pod) {
		c.forgetProblems(key)
		return c.desired.DeletePod(key), nil
	}
	ref := cache.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
	// Only a managed node's pods are told why a volume is not attached, and
	// counted in the mechanism decisions: elsewhere kubelet attaches. (A
	// node turning managed queues its pods: nodeChanged.)
	n, err := c.nodes.Get(node)
	tell := err == nil && managed(n)
	vols := c.podVolumes(ctx, pod, tell)
	touched := c.desired.SetPodVolumes(ref, node, vols)
	if tell {
		c.countDecisions(vols, touched)
		if f, ok := c.actual.Node(node); !ok || !f.Exists || !f.Managed {
			// The node's facts wait for its pods to be read before they
			// say managed (setNode): this may be the last one.
			c.nodeQueue.Add(node)
		}
	}
	return touched, nil
}

// managed tells whether the node's kubelet leaves attach and detach to
// this controller.
func managed(node *v1.Node) bool {
	_, ok := node.Annotations[managedAnnotation]
	return ok
}

// podTerminated is upstream's IsPodTerminated: the pod Succeeded or Failed,
// or it is being deleted and none of its containers runs any more.
func podTerminated(pod *v1.Pod) bool {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return true
	}
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, statuses := range [][]v1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses,
		pod.Status.EphemeralContainerStatuses} {
		for _, st := range statuses {
			if st.State.Terminated == nil && st.State.Waiting == nil {
				return false
			}
		}
	}
	return true
}

// podVolumes resolves each volume of pod into the spec to attach on its
// node. A volume that can't be resolved is reported on the pod and left out;
// the pod's other volumes are unaffected. A live pod never loses a volume it
// had: one that can no longer be resolved (its claim deleted, its PV deleted
// or bound elsewhere) or now resolves to another volume stays wanted, with a
// warning, until the pod terminates or goes, as upstream keeps it.
//
// Without tell, nothing is reported: the pod's node is not managed.
func (c *Controller) podVolumes(ctx context.Context, pod *v1.Pod, tell bool) []cache.PodVolume {
	logger := klog.FromContext(ctx)
	key := pod.Namespace + "/" + pod.Name
	had := map[string][]*volume.Spec{}
	for _, pv := range c.desired.PodVolumes(key, string(pod.UID)) {
		had[pv.Name] = append(had[pv.Name], pv.Spec)
	}
	report := func(volName, reason, msg string) {
		if tell {
			c.reportProblemEvent(pod, volName, reason, msg)
		}
	}
	var vols []cache.PodVolume
	seen := map[string]bool{}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		spec, err := c.podVolume(ctx, pod, vol)
		for _, old := range had[vol.Name] {
			if err == nil && spec != nil && sharesName(old, spec) {
				continue
			}
			vols = append(vols, cache.PodVolume{Name: vol.Name, Spec: old})
			why := err
			if err == nil {
				why = fmt.Errorf("it now resolves to volume %s", describeSpec(spec))
			}
			if tell {
				logger.Info("Volume of a running pod can no longer be resolved; it stays attached until the pod terminates",
					"volume", vol.Name, "attached", old.Name, "reason", why)
			}
			report(vol.Name, "VolumeKeptAttached", fmt.Sprintf(
				"volume %q stays attached as %s until the pod terminates, but it can no longer be resolved: %s", vol.Name, old.Name, why))
		}
		switch {
		case errors.Is(err, errWaiting):
			logger.V(4).Info("Volume not ready to attach", "volume", vol.Name, "reason", err)
		case errors.Is(err, volume.ErrNotAttachable):
		case err != nil:
			if len(had[vol.Name]) > 0 {
				break
			}
			if former := c.formerVolume(ctx, pod, vol); former != nil {
				vols = append(vols, cache.PodVolume{Name: vol.Name, Spec: former})
				report(vol.Name, "VolumeKeptAttached", fmt.Sprintf(
					"volume %q stays attached as %s until the pod terminates, but it can no longer be resolved: %s", vol.Name, former.Name, err))
				break
			}
			if wait := c.claimGraceLeft(pod, err); tell && wait > 0 {
				logger.V(2).Info("Claim not found yet: the pod is warned if it is still missing then", "volume", vol.Name, "reason", err, "after", wait)
				c.podQueue.AddAfter(key, wait)
				break
			}
			report(vol.Name, "FailedAttachVolume", fmt.Sprintf("AttachVolume.Attach failed for volume %q : %s", vol.Name, err))
		case spec != nil:
			vols = append(vols, cache.PodVolume{Name: vol.Name, Spec: spec})
		}
		if (err == nil || errors.Is(err, errWaiting) || errors.Is(err, volume.ErrNotAttachable)) && len(had[vol.Name]) == 0 {
			seen[vol.Name] = true
		}
		if err == nil && spec != nil && allShareName(had[vol.Name], spec) {
			seen[vol.Name] = true
		}
	}
	if !tell {
		c.forgetProblems(key)
		return vols
	}
	c.clearProblems(pod, seen)
	return vols
}

// formerVolume finds, for a pod volume whose claim is gone, the volume the
// pod had before a restart made the controller forget it: the PV still bound
// to a claim of that name, when it is attached to the pod's node.
func (c *Controller) formerVolume(ctx context.Context, pod *v1.Pod, vol *v1.Volume) *volume.Spec {
	claim := volume.ClaimName(pod, vol)
	if claim == "" {
		return nil
	}
	for _, name := range c.claimPVs.get(pod.Namespace + "/" + claim) {
		// The index is the handler's: the lister may hold a newer PV.
		pv, err := c.pvs.Get(name)
		if err != nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != pod.Namespace || pv.Spec.ClaimRef.Name != claim {
			continue
		}
		spec, err := volume.Resolve(klog.FromContext(ctx), volume.Source{PV: pv, PodNamespace: pod.Namespace}, pod.Spec.NodeName, c.nodeView.Decide)
		if err != nil {
			continue
		}
		for _, name := range spec.AllNames() {
			if _, attached := c.actual.Get(cache.Key{Volume: name, Node: pod.Spec.NodeName}); attached {
				return spec
			}
		}
	}
	return nil
}

// sharesName reports whether two specs name one volume (a migratable volume
// has two names; which one comes first depends on the node's mechanism).
func sharesName(a, b *volume.Spec) bool {
	for _, n := range a.AllNames() {
		if slices.Contains(b.AllNames(), n) {
			return true
		}
	}
	return false
}

func allShareName(specs []*volume.Spec, s *volume.Spec) bool {
	for _, o := range specs {
		if !sharesName(o, s) {
			return false
		}
	}
	return true
}

func describeSpec(s *volume.Spec) string {
	if s == nil {
		return "(none)"
	}
	return string(s.Name)
}

// errWaiting marks a volume that is not an error but not ready either (an
// unbound claim).
var errWaiting = errors.New("waiting")

// claimMissingError: the pod's claim is not in the lister.
type claimMissingError struct{ claim string }

func (e *claimMissingError) Error() string {
	return fmt.Sprintf("PersistentVolumeClaim %q not found", e.claim)
}

// claimGrace is how long after a pod's creation its missing claim is only
// waited for: the ephemeral volume controller creates a generic ephemeral
// volume's claim right after the pod, and a claim applied with its pod may
// come a moment later. kube-controller-manager never warns of a missing
// claim (it logs it at V(10) and waits for the claim's event); the volume
// is not attached either way, and the claim's arrival queues the pod.
const claimGrace = 10 * time.Second

// claimGraceLeft is how long a pod whose volume failed with err is yet to
// wait before it is warned: some of claimGrace when the claim is missing,
// else 0.
func (c *Controller) claimGraceLeft(pod *v1.Pod, err error) time.Duration {
	var missing *claimMissingError
	if !errors.As(err, &missing) {
		return 0
	}
	return claimGrace - c.clock.Since(pod.CreationTimestamp.Time)
}

func (c *Controller) podVolume(ctx context.Context, pod *v1.Pod, vol *v1.Volume) (*volume.Spec, error) {
	src := volume.Source{Inline: vol, PodNamespace: pod.Namespace}
	if claim := volume.ClaimName(pod, vol); claim != "" {
		pv, err := c.claimedPV(pod, vol, claim)
		if err != nil {
			return nil, err
		}
		src = volume.Source{PV: pv, PodNamespace: pod.Namespace}
	}
	spec, err := volume.Resolve(klog.FromContext(ctx), src, pod.Spec.NodeName, c.nodeView.Decide)
	if err != nil {
		return nil, err
	}
	if spec.Kind == volume.KindCSI && !c.attachRequired(spec.Driver) {
		return nil, volume.ErrNotAttachable
	}
	return spec, nil
}

// claimedPV follows a pod's claim to its PV. The PV counts only when the
// claim is bound to it and it is bound to the claim (claimRef.uid).
func (c *Controller) claimedPV(pod *v1.Pod, vol *v1.Volume, claim string) (*v1.PersistentVolume, error) {
	pvc, err := c.pvcs.PersistentVolumeClaims(pod.Namespace).Get(claim)
	if apierrors.IsNotFound(err) {
		return nil, &claimMissingError{claim: pod.Namespace + "/" + claim}
	}
	if err != nil {
		return nil, fmt.Errorf("get PersistentVolumeClaim %s/%s: %w", pod.Namespace, claim, err)
	}
	if vol.Ephemeral != nil && !metav1.IsControlledBy(pvc, pod) {
		return nil, fmt.Errorf("PersistentVolumeClaim %q was not created for this pod (generic ephemeral volume %q)", pod.Namespace+"/"+claim, vol.Name)
	}
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("claim %s is not bound: %w", claim, errWaiting)
	}
	pv, err := c.pvs.Get(pvc.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("PersistentVolume %q of claim %q not found", pvc.Spec.VolumeName, pod.Namespace+"/"+claim)
	}
	if err != nil {
		return nil, fmt.Errorf("get PersistentVolume %s: %w", pvc.Spec.VolumeName, err)
	}
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return nil, fmt.Errorf("PersistentVolume %s is not bound to claim %s yet: %w", pv.Name, claim, errWaiting)
	}
	return pv, nil
}

// attachRequired is false only for a CSIDriver that says so; a missing
// CSIDriver object means attach is required.
func (c *Controller) attachRequired(driver string) bool {
	d, err := c.csiDrivers.Get(driver)
	if err != nil || d.Spec.AttachRequired == nil {
		return true
	}
	return *d.Spec.AttachRequired
}

// countDecisions counts the mechanism decisions for in-tree volumes that
// changed the desired state.
func (c *Controller) countDecisions(vols []cache.PodVolume, touched []cache.Key) {
	changed := make(map[volume.Name]bool, len(touched))
	for _, k := range touched {
		changed[k.Volume] = true
	}
	for _, v := range vols {
		s := v.Spec
		if s.PluginName == volume.CSIPluginName || s.PluginName == "" || !changed[s.Name] {
			continue
		}
		mech := string(s.Kind)
		if s.Pending != "" {
			mech = "pending"
		}
		c.cfg.Metrics.MechanismDecisions.WithLabelValues(s.PluginName, mech).Inc()
	}
}

// reportProblemEvent posts a warning with reason on the pod about one of its
// volumes, once per distinct message.
func (c *Controller) reportProblemEvent(pod *v1.Pod, volName, reason, msg string) {
	key := pod.Namespace + "/" + pod.Name
	c.mu.Lock()
	vols := c.problems[key]
	if vols == nil {
		vols = map[string]string{}
		c.problems[key] = vols
	}
	told := vols[volName] == msg
	vols[volName] = msg
	c.mu.Unlock()
	if told {
		return
	}
	c.cfg.Recorder.Event(pod, v1.EventTypeWarning, reason, msg)
}

func (c *Controller) clearProblems(pod *v1.Pod, ok map[string]bool) {
	key := pod.Namespace + "/" + pod.Name
	c.mu.Lock()
	defer c.mu.Unlock()
	for v := range c.problems[key] {
		if ok[v] {
			delete(c.problems[key], v)
		}
	}
	if len(c.problems[key]) == 0 {
		delete(c.problems, key)
	}
}

func (c *Controller) forgetProblems(key string) {
	c.mu.Lock()
	delete(c.problems, key)
	c.mu.Unlock()
}
