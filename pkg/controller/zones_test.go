package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func zone(z string) nodeOpt {
	return func(n *v1.Node) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[v1.LabelTopologyZone] = z
	}
}

// Eight of ten nodes of a zone go NotReady at once, their pods gone: a
// partition more likely than a mass death. Their forced detaches by
// timeout are held (event, metrics, the decision's reason) while the other
// zone's dead node is still handled; the out-of-service taint still
// detaches at once; once the nodes return, the held detaches due are done
// and the rest wait for their unmount as usual.
func TestDisruptedZoneHoldsForcedDetaches(t *testing.T) {
	var objs []runtime.Object
	name := func(i int) string { return fmt.Sprintf("a%d", i) }
	vol := func(i int) string { return fmt.Sprintf("h%d", i) }
	for i := range 11 {
		c := fmt.Sprintf("claim-%d", i)
		objs = append(objs, csiPV(c, vol(i)), claim(c))
	}
	nodes := func(notReadyUpTo int, extra map[int][]nodeOpt) []runtime.Object {
		var out []runtime.Object
		for i := range 10 {
			opts := []nodeOpt{zone("a"), inUse(csiName(vol(i))), resourceVersion(fmt.Sprint(20 + notReadyUpTo))}
			if i < notReadyUpTo {
				opts = append(opts, notReady)
			}
			opts = append(opts, extra[i]...)
			out = append(out, node(name(i), opts...), va(fmt.Sprintf("claim-%d", i), vol(i), name(i)))
		}
		return append(out, node("b0", zone("b"), notReady, inUse(csiName(vol(10))), resourceVersion("20")),
			va("claim-10", vol(10), "b0"))
	}
	f := newFixtureWith(t, func(c *Config) {
		c.Reconciler.UnhealthyZoneThreshold, c.Reconciler.UnhealthyZoneMinNodes = 0.55, 3
	}, append(objs, nodes(0, nil)...)...)
	for i := range 10 {
		f.syncFirst(name(i), []string{vol(i)})
	}
	f.syncFirst("b0", []string{vol(10)})
	f.drain()
	f.takeEvents()

	f.load(append(objs, nodes(8, nil)...)...)
	for i := range 8 {
		must(t, f.c.syncNode(f.ctx, name(i)))
	}
	events := f.takeEvents()
	if len(events) != 1 || !strings.Contains(events[0], `ZoneDisrupted zone "a" is disrupted: 6 of 10 nodes not ready, threshold 55%`) {
		t.Errorf("events %q, want one ZoneDisrupted when the sixth node went", events)
	}
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 1 {
		t.Errorf("disrupted zones %v, want 1", got)
	}
	f.clock.Step(7 * time.Minute)
	for _, k := range f.c.actual.Keys() {
		f.volumes.Add(k)
	}
	f.drain()
	deleted := func() []string {
		var out []string
		for _, w := range f.writes() {
			if strings.HasPrefix(w, "delete volumeattachments ") {
				out = append(out, strings.TrimPrefix(w, "delete volumeattachments "))
			}
		}
		return out
	}
	vaName := func(i int, node string) string { return volume.AttachmentName(vol(i), driver, node) }
	if got := deleted(); !slices.Equal(got, []string{vaName(10, "b0")}) {
		t.Errorf("deleted %v, want only b0's (zone b is one dead node)", got)
	}
	if got := testutil.ToFloat64(f.c.cfg.Metrics.ForcedDetachesHeld); got != 8 {
		t.Errorf("forced detaches held %v, want 8", got)
	}
	k0 := cache.Key{Volume: volume.CSIName(driver, vol(0)), Node: name(0)}
	if d := f.c.reconciler.Decide(k0, f.clock.Now()); !strings.Contains(d.Reason, `forced detach held: zone "a" is disrupted: 8 of 10 nodes not ready`) {
		t.Errorf("decision %v, want held by the zone", d)
	}

	// An out-of-service taint detaches at once.
	f.reset()
	f.load(append(objs, nodes(8, map[int][]nodeOpt{1: {outOfService, resourceVersion("40")}})...)...)
	must(t, f.c.syncNode(f.ctx, name(1)))
	f.drain()
	if got := deleted(); !slices.Equal(got, []string{vaName(1, name(1))}) {
		t.Errorf("deleted %v, want a1's (out of service)", got)
	}

	// Six come back Ready, their volumes still mounted: the zone recovers.
	// a0, still NotReady, gets the max wait again from then (a partition
	// heals node by node); the others wait for their unmount.
	f.reset()
	back := map[int][]nodeOpt{1: {outOfService}}
	for i := 2; i < 8; i++ {
		back[i] = []nodeOpt{func(n *v1.Node) { n.Status.Conditions[0].Status = v1.ConditionTrue }}
	}
	f.load(append(objs, nodes(8, back)...)...)
	for i := 2; i < 8; i++ {
		must(t, f.c.syncNode(f.ctx, name(i)))
	}
	f.drain()
	if events := f.takeEvents(); len(events) != 1 || !strings.Contains(events[0], "ZoneRecovered") {
		t.Errorf("events %q, want one ZoneRecovered", events)
	}
	if got := deleted(); len(got) != 0 {
		t.Errorf("deleted %v right after the zone recovered, want nothing", got)
	}
	if d := f.c.reconciler.Decide(k0, f.clock.Now()); !strings.Contains(d.Reason, "its zone recovered from a disruption 0s ago: forced detach in 6m0s") {
		t.Errorf("decision %v, want a fresh max wait", d)
	}
	f.clock.Step(6*time.Minute + time.Second)
	f.volumes.Add(k0)
	f.drain()
	if got := deleted(); !slices.Equal(got, []string{vaName(0, name(0))}) {
		t.Errorf("deleted %v, want a0's once the max wait passed again", got)
	}
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones) + testutil.ToFloat64(f.c.cfg.Metrics.ForcedDetachesHeld); got != 0 {
		t.Errorf("disrupted zones and held detaches: %v, want none", got)
	}
}
