package main

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// milestone names a moment of one pod's story, as the watches saw it.
type milestone string

// The milestones of a pod started by a scale-up, in the order they happen.
const (
	mCreated     milestone = "created"       // the StatefulSet controller created the pod
	mSelected    milestone = "node selected" // kube-scheduler annotated the claim with its node
	mProvisioned milestone = "PV created"    // the external-provisioner created the volume
	mBound       milestone = "claim bound"   // the PV controller bound the claim
	mOnNode      milestone = "pod on node"   // kube-scheduler bound the pod
	mVACreated   milestone = "VA created"    // the attach/detach controller asked for the attach
	mAttached    milestone = "VA attached"   // the external-attacher attached it
	mListed      milestone = "listed"        // the attach/detach controller put it in volumesAttached
	mRunning     milestone = "Running"       // the kubelet mounted it and ran the pod
)

// The milestones of a pod moved by a drain (its new pod's are the
// scale-up's from mCreated on) and of one scaled away.
const (
	mEvicted     milestone = "evicted"          // the old pod's deletionTimestamp
	mOldGone     milestone = "old pod gone"     // the old pod removed from the API
	mUnmounted   milestone = "unmounted"        // out of the old node's volumesInUse
	mUnlisted    milestone = "unlisted"         // out of the old node's volumesAttached
	mDetachBegun milestone = "detach begun"     // the old VolumeAttachment's deletionTimestamp
	mDetached    milestone = "detached"         // the old VolumeAttachment gone
	mAttachable  milestone = "attachable again" // the later of mDetached and the new pod on its node
)

// times are one pod's milestones; a missing one was not seen.
type times map[milestone]time.Time

// span is the time from one milestone (the latest of from) to another,
// and who acts in it.
type span struct {
	what string
	who  string
	from []milestone
	to   milestone
	// adc marks the attach/detach controller's own part.
	adc bool
}

func (s span) of(t times) (time.Duration, bool) {
	var start time.Time
	for _, m := range s.from {
		at, ok := t[m]
		if !ok {
			return 0, false
		}
		if at.After(start) {
			start = at
		}
	}
	end, ok := t[s.to]
	if !ok {
		return 0, false
	}
	return end.Sub(start), true
}

func sp(what, who string, from, to milestone) span {
	return span{what: what, who: who, from: []milestone{from}, to: to}
}

// adc is the attach/detach controller in the "who" column.
const adc = "**attach/detach controller**"

// The headline spans of a start: ClusterLoader2's pod startup, and the
// attach's share of it (pod on its node until its volume is in the node's
// volumesAttached: the attach/detach controller's two steps and the
// external-attacher's one between them).
var (
	podStartup  = sp("pod startup: created → Running", "all", mCreated, mRunning)
	attachShare = span{what: "attach: pod on node → listed in volumesAttached", who: "attach/detach controller + csi-attacher", from: []milestone{mOnNode}, to: mListed}
)

// startSpans break a pod's start into the parts each component plays.
var startSpans = []span{
	sp("created → node selected (claim annotated)", "kube-scheduler", mCreated, mSelected),
	sp("node selected → PV created", "csi-provisioner", mSelected, mProvisioned),
	sp("PV created → claim bound", "PV controller (kube-controller-manager)", mProvisioned, mBound),
	sp("claim bound → pod on node", "kube-scheduler (bind)", mBound, mOnNode),
	{what: "pod on node → VolumeAttachment created", who: adc, from: []milestone{mOnNode}, to: mVACreated, adc: true},
	sp("VolumeAttachment created → attached", "csi-attacher", mVACreated, mAttached),
	{what: "attached → listed in node's volumesAttached", who: adc, from: []milestone{mAttached}, to: mListed, adc: true},
	sp("listed → Running (status cycle, mount)", "kubelet", mListed, mRunning),
}

// moveSpans break a drained pod's move into its parts.
var moveSpans = []span{
	sp("eviction → old pod gone", "kubelet", mEvicted, mOldGone),
	sp("old pod gone → unmounted (out of volumesInUse)", "kubelet", mOldGone, mUnmounted),
	{what: "unmounted → out of old node's volumesAttached", who: adc, from: []milestone{mUnmounted}, to: mUnlisted, adc: true},
	{what: "unmounted → detach begun (VolumeAttachment deleted)", who: adc, from: []milestone{mUnmounted}, to: mDetachBegun, adc: true},
	sp("detach begun → VolumeAttachment gone", "csi-attacher", mDetachBegun, mDetached),
	sp("old pod gone → new pod on node", "StatefulSet controller, kube-scheduler", mOldGone, mOnNode),
	{what: "attachable (detached, new pod on node) → new VolumeAttachment created", who: adc, from: []milestone{mDetached, mOnNode}, to: mVACreated, adc: true},
	sp("new VolumeAttachment created → attached", "csi-attacher", mVACreated, mAttached),
	{what: "attached → listed in new node's volumesAttached", who: adc, from: []milestone{mAttached}, to: mListed, adc: true},
	sp("listed → Running", "kubelet", mListed, mRunning),
}

// moveTotal is a drained pod's whole move.
var moveTotal = sp("eviction → Running on another node", "all", mEvicted, mRunning)

// stopSpans break a scaled-away pod's teardown into its parts.
var stopSpans = []span{
	sp("pod deleted → gone", "kubelet", mEvicted, mOldGone),
	sp("gone → unmounted (out of volumesInUse)", "kubelet", mOldGone, mUnmounted),
	{what: "unmounted → detach begun (VolumeAttachment deleted)", who: adc, from: []milestone{mUnmounted}, to: mDetachBegun, adc: true},
	sp("detach begun → VolumeAttachment gone", "csi-attacher", mDetachBegun, mDetached),
}

// stopTotal is a scaled-away pod's deletion to its volume detached.
var stopTotal = sp("pod deleted → VolumeAttachment gone", "all", mEvicted, mDetached)

// distribution is a span over a set of pods.
type distribution struct {
	sorted  []time.Duration
	missing int // pods where a milestone was not seen
}

func distributionOf(s span, pods []times) distribution {
	var d distribution
	for _, t := range pods {
		if v, ok := s.of(t); ok {
			d.sorted = append(d.sorted, v)
		} else {
			d.missing++
		}
	}
	slices.Sort(d.sorted)
	return d
}

// percentile is the nearest-rank percentile; 0 of nothing.
func (d distribution) percentile(p float64) time.Duration {
	if len(d.sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(d.sorted)))) - 1
	return d.sorted[min(max(i, 0), len(d.sorted)-1)]
}

// startTimes are the names and milestones of the first pod of each name
// of the StatefulSet (a pod started by the scale-up), by ordinal.
func (t *timeline) startTimes(ns, sts string, replicas int) ([]string, []times) {
	t.mu.Lock()
	defer t.mu.Unlock()
	byName := map[string]*podFacts{}
	for _, p := range t.pods {
		if _, ok := ordinalOf(sts, p.name); !ok {
			continue
		}
		if q := byName[p.name]; q == nil || p.created.Before(q.created) {
			byName[p.name] = p
		}
	}
	names := make([]string, 0, replicas)
	out := make([]times, 0, replicas)
	for i := range replicas {
		name := sts + "-" + strconv.Itoa(i)
		tt := times{}
		if p := byName[name]; p != nil {
			t.podStart(tt, ns, stack.StatefulSetClaim(sts, i), p)
		}
		names = append(names, name)
		out = append(out, tt)
	}
	return names, out
}

// podStart adds the milestones of p's start, its claim and its volume on
// its node to tt. t.mu is held.
func (t *timeline) podStart(tt times, ns, claim string, p *podFacts) {
	set(tt, mCreated, p.created)
	set(tt, mOnNode, p.onNode)
	set(tt, mRunning, p.running)
	c := t.claims[ns+"/"+claim]
	if c == nil {
		return
	}
	set(tt, mSelected, c.selected)
	set(tt, mBound, c.bound)
	pv := t.pvs[c.volume]
	if pv == nil {
		return
	}
	set(tt, mProvisioned, pv.created)
	if va := t.vas[vaKey{c.volume, p.node}]; va != nil {
		set(tt, mVACreated, va.created)
		set(tt, mAttached, va.attached)
	}
	if nv := t.nodes[nodeVolume{p.node, pv.unique}]; nv != nil {
		set(tt, mListed, nv.listed)
	}
}

// stopTimes are the milestones of pod p's end on its node, its volume's
// unmount and detach there, in tt. t.mu is held.
func (t *timeline) podStop(tt times, ns, claim string, p *podFacts) {
	set(tt, mEvicted, p.deleting)
	set(tt, mOldGone, p.gone)
	c := t.claims[ns+"/"+claim]
	if c == nil {
		return
	}
	pv := t.pvs[c.volume]
	if pv == nil {
		return
	}
	if va := t.vas[vaKey{c.volume, p.node}]; va != nil {
		set(tt, mDetachBegun, va.deleting)
		set(tt, mDetached, va.gone)
	}
	if nv := t.nodes[nodeVolume{p.node, pv.unique}]; nv != nil {
		set(tt, mUnmounted, nv.unused)
		set(tt, mUnlisted, nv.unlisted)
	}
}

// stoppedTimes are the names and end milestones of the StatefulSet's pods
// deleted since `since` (a scale-down), by name.
func (t *timeline) stoppedTimes(ns, sts string, since time.Time) ([]string, []times) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pods []*podFacts
	for _, p := range t.pods {
		if _, ok := ordinalOf(sts, p.name); ok && !p.deleting.Before(since) {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, func(a, b *podFacts) int { return strings.Compare(a.name, b.name) })
	names := make([]string, 0, len(pods))
	out := make([]times, 0, len(pods))
	for _, p := range pods {
		i, _ := ordinalOf(sts, p.name)
		tt := times{}
		t.podStop(tt, ns, stack.StatefulSetClaim(sts, i), p)
		names = append(names, p.name)
		out = append(out, tt)
	}
	return names, out
}

// moveTimes are, for each pod a drain evicted (by UID), the milestones of
// its end on the old node and of the start of the pod of the same name
// that replaced it.
func (t *timeline) moveTimes(ns, sts string, evicted []types.UID) []moved {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]moved, 0, len(evicted))
	for _, uid := range evicted {
		old := t.pods[uid]
		if old == nil {
			out = append(out, moved{times: times{}})
			continue
		}
		m := moved{pod: old.name, from: old.node, times: times{}}
		i, ok := ordinalOf(sts, old.name)
		if !ok {
			out = append(out, m)
			continue
		}
		claim := stack.StatefulSetClaim(sts, i)
		t.podStop(m.times, ns, claim, old)
		var repl *podFacts
		for _, p := range t.pods {
			if p.name == old.name && p.uid != uid && p.created.After(old.created) && (repl == nil || p.created.Before(repl.created)) {
				repl = p
			}
		}
		if repl != nil {
			m.to = repl.node
			start := times{}
			t.podStart(start, ns, claim, repl)
			// The claim's and PV's milestones are the first start's.
			for _, k := range []milestone{mCreated, mOnNode, mVACreated, mAttached, mListed, mRunning} {
				set(m.times, k, start[k])
			}
		}
		out = append(out, m)
	}
	return out
}

// moved is one drained pod: its node before and after, and its milestones.
type moved struct {
	pod, from, to string
	times         times
}

func set(tt times, m milestone, at time.Time) {
	if !at.IsZero() {
		tt[m] = at
	}
}

// ordinalOf is the ordinal of a pod of the StatefulSet sts.
func ordinalOf(sts, pod string) (int, bool) {
	rest, ok := strings.CutPrefix(pod, sts+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

// latest is the latest moment m among pods, and whether every pod has it.
func latest(pods []times, m milestone) (time.Time, bool) {
	var out time.Time
	for _, t := range pods {
		at, ok := t[m]
		if !ok {
			return out, false
		}
		if at.After(out) {
			out = at
		}
	}
	return out, len(pods) > 0
}
