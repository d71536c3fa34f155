package sim

import (
	"hash/fnv"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The kubelet of each node, as its volume manager and node status loop
// behave (k8s.io/kubernetes v1.37, pkg/kubelet/volumemanager and
// kubelet_node_status.go), with the controller attaching and detaching:
//
//   - what it reports in use (GetVolumesInUse) is every volume a live pod on
//     the node uses (its desired state: attached or not, an RWO volume still
//     attached elsewhere too) and every volume still mounted there (its
//     actual state: also one whose pod was removed at once, until it is
//     really unmounted);
//   - node.status.volumesInUse is written only by the node status loop, at
//     its ticks every statusCycle (nodeStatusUpdateFrequency), and only when
//     it changed: a volume unmounted leaves it at the next tick, after its
//     pod has gone;
//   - a volume is mounted for a pod only once node.status.volumesInUse
//     lists it (the kubelet marks it reported in use from the node it
//     wrote) and node.status.volumesAttached lists it;
//   - a pod's volume is unmounted once the pod no longer runs (its
//     containers stopped, it Succeeded, or it was removed at once), an
//     unmount may fail and be tried again, and a pod being deleted is
//     removed from the API only once its volumes are unmounted.
//
// A NotReady node's kubelet does nothing. A Node created again is a new
// kubelet: it has nothing mounted.

// statusCycle is kubelet's nodeStatusUpdateFrequency (10 s by default).
const statusCycle = 10 * time.Second

// unmountFails is the chance that one unmount attempt fails (kubelet tries
// again: a volume stays mounted and in use 40 s and more when it fails).
const unmountFails = 0.25

// kubeletName is the name kubelet gives the volume: every in-tree plugin
// that can be translated is migrated to CSI in kubelet v1.37, so the CSI
// name, the last one.
func kubeletName(v *simVolume) string { return v.names[len(v.names)-1] }

// kubeletWants is the kubelet's desired state: the volumes (by kubelet's
// name) of the live pods on the node whose claim and PV it could read.
func (s *Sim) kubeletWants(node string) map[string][]string {
	wants := map[string][]string{}
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		if p.Spec.NodeName == node && live(p) && s.resolved(p) {
			name := kubeletName(s.volumeByPV(podPV(p)))
			wants[name] = append(wants[name], string(p.UID))
		}
	}
	return wants
}

// kubeletChange is the volumesInUse a node's kubelet would write at its
// next status tick, or nil when that is what node status lists already.
func (s *Sim) kubeletChange(n *v1.Node) []v1.UniqueVolumeName {
	if !ready(n) {
		return nil
	}
	set := map[v1.UniqueVolumeName]bool{}
	for name := range s.kubeletWants(n.Name) {
		set[v1.UniqueVolumeName(name)] = true
	}
	for name := range s.mounts[n.Name] {
		set[v1.UniqueVolumeName(name)] = true
	}
	// What a kubelet that attached by itself mounted, it reports too.
	for name := range s.selfMounted[n.Name] {
		set[v1.UniqueVolumeName(name)] = true
	}
	want := slices.Sorted(maps.Keys(set))
	have := slices.Clone(n.Status.VolumesInUse)
	slices.Sort(have)
	if slices.Equal(want, slices.Compact(have)) {
		return nil
	}
	if want == nil {
		want = []v1.UniqueVolumeName{}
	}
	return want
}

// statusTick is the last tick of node's status loop at or before now, and
// whether there was one yet. Each node's loop has its own phase.
func (s *Sim) statusTick(node string) (time.Time, bool) {
	h := fnv.New32a()
	h.Write([]byte(node))
	first := simEpoch.Add(time.Duration(h.Sum32()) % statusCycle)
	now := s.clock.Now()
	if now.Before(first) {
		return first, false
	}
	return first.Add(now.Sub(first) / statusCycle * statusCycle), true
}

// statusDue: the node's status loop has ticked since it last wrote.
func (s *Sim) statusDue(node string) bool {
	tick, ok := s.statusTick(node)
	written, wrote := s.statusWritten[node]
	return ok && (!wrote || tick.After(written))
}

// nextStatusTick is when a change the node's kubelet has to report will be
// written, if it is not due now.
func (s *Sim) nextStatusTick(node string) time.Time {
	tick, ok := s.statusTick(node)
	if !ok {
		return tick
	}
	return tick.Add(statusCycle)
}

// kubelet writes node's volumesInUse, at a tick of its status loop.
func (s *Sim) kubelet(node string) {
	n := s.w.node(node).DeepCopy()
	want := s.kubeletChange(n)
	s.tracef("kubelet %s: volumesInUse %v", node, want)
	for _, name := range want {
		if !slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == name }) {
			s.stats["kubelet: volume reported in use before node status lists it attached"]++
		}
	}
	n.Status.VolumesInUse = want
	s.statusWritten[node], _ = s.statusTick(node)
	s.w.update(rNodes, n)
}

// kubeletMounts returns the mounts and unmounts a node's kubelet would make
// now, and the removal of its pods being deleted whose volumes are
// unmounted.
func (s *Sim) kubeletMounts(n *v1.Node) []func() {
	if !ready(n) {
		return nil
	}
	var todo []func()
	inUse := map[string]bool{}
	for _, v := range n.Status.VolumesInUse {
		inUse[string(v)] = true
	}
	attached := map[string]bool{}
	for _, a := range n.Status.VolumesAttached {
		attached[string(a.Name)] = true
	}
	wants := s.kubeletWants(n.Name)
	if !s.attachesByItself(n.Name) {
		for _, name := range slices.Sorted(maps.Keys(wants)) {
			if !inUse[name] || !attached[name] {
				continue
			}
			for _, uid := range wants[name] {
				if s.mounts[n.Name][name][uid] {
					continue
				}
				todo = append(todo, func() {
					s.stats["kubelet: volume mounted for a pod"]++
					s.tracef("kubelet %s: mounted %s for pod %s", n.Name, name, uid)
					if s.mounts[n.Name] == nil {
						s.mounts[n.Name] = map[string]map[string]bool{}
					}
					if s.mounts[n.Name][name] == nil {
						s.mounts[n.Name][name] = map[string]bool{}
					}
					s.mounts[n.Name][name][uid] = true
				})
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.mounts[n.Name])) {
		for _, uid := range slices.Sorted(maps.Keys(s.mounts[n.Name][name])) {
			if slices.Contains(wants[name], uid) {
				continue
			}
			todo = append(todo, func() { s.unmount(n.Name, name, uid) })
		}
	}
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		if p.Spec.NodeName != n.Name || p.DeletionTimestamp == nil || live(p) || s.podMounted(n.Name, string(p.UID)) {
			continue
		}
		todo = append(todo, func() {
			s.tracef("kubelet %s: pod %s gone (its volumes unmounted)", n.Name, p.Name)
			if slices.Contains(n.Status.VolumesInUse, v1.UniqueVolumeName(kubeletName(s.volumeByPV(podPV(p))))) {
				s.stats["kubelet: pod gone, its volume still in volumesInUse"]++
			}
			s.w.remove(rPods, keyOf(p))
		})
	}
	return todo
}

// unmount tears down pod uid's mount of a volume on node; the last pod's
// unmounts the device: kubelet's actual state forgets the volume.
func (s *Sim) unmount(node, name, uid string) {
	if s.chance(unmountFails) {
		s.stats["fault: unmount failed"]++
		s.tracef("kubelet %s: unmount of %s for pod %s failed, tried again later", node, name, uid)
		return
	}
	delete(s.mounts[node][name], uid)
	if len(s.mounts[node][name]) == 0 {
		delete(s.mounts[node], name)
		s.tracef("kubelet %s: unmounted %s (its last pod %s)", node, name, uid)
		return
	}
	s.tracef("kubelet %s: unmounted %s for pod %s", node, name, uid)
}

// podMounted: a volume of pod uid is still mounted for it on node.
func (s *Sim) podMounted(node, uid string) bool {
	for _, pods := range s.mounts[node] {
		if pods[uid] {
			return true
		}
	}
	return false
}
