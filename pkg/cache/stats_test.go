package cache

import (
	"fmt"
	"maps"
	"math/rand"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The counts a scrape reads are kept as the caches change; after any
// sequence of changes they must equal a count of every entry.
func TestStatsMatchAFullCount(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	specs := []*volume.Spec{
		{Name: volume.CSIName("a.example.com", "h1"), Kind: volume.KindCSI, Driver: "a.example.com", VolumeHandle: "h1"},
		{Name: volume.CSIName("b.example.com", "h2"), Kind: volume.KindCSI, Driver: "b.example.com", VolumeHandle: "h2"},
		{Name: "kubernetes.io/aws-ebs/vol-1", Kind: volume.KindInTree, PluginName: "kubernetes.io/aws-ebs"},
		{Name: "kubernetes.io/aws-ebs/vol-1", Kind: volume.KindInTree, PluginName: "kubernetes.io/aws-ebs", Pending: "no CSINode yet"},
	}
	nodes := []string{"n1", "n2", "n3"}
	states := []State{Uncertain, Attached, Detaching}
	d, a := NewDesiredState(), NewActualState()
	counted := map[string]bool{}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for step := range 5000 {
		pod := PodRef{Namespace: "ns", Name: fmt.Sprintf("p%d", rng.Intn(6)), UID: fmt.Sprint(rng.Intn(2))}
		node := nodes[rng.Intn(len(nodes))]
		k := Key{Volume: specs[rng.Intn(len(specs))].Name, Node: node}
		switch rng.Intn(5) {
		case 0:
			var want []*volume.Spec
			for _, s := range specs {
				if rng.Intn(3) == 0 {
					want = append(want, s)
				}
			}
			d.SetPod(pod, node, want)
		case 1:
			d.DeletePod(pod.String())
		case 2, 3:
			st := states[rng.Intn(len(states))]
			started := time.Time{}
			if rng.Intn(2) == 0 {
				started = start.Add(time.Duration(rng.Intn(100)) * time.Second)
			}
			a.Update(k, true, func(at *Attachment) { at.State, at.AttachStarted = st, started })
		case 4:
			a.Delete(k)
		}

		// A node counts (it exists and is managed) for a while, then not.
		if rng.Intn(20) == 0 {
			n := nodes[rng.Intn(len(nodes))]
			counted[n] = !counted[n]
			d.SetCounted(n, counted[n])
		}
		wantPlugins, wantPending := map[string]int{}, 0
		for k, e := range d.entries {
			if !counted[k.Node] {
				continue
			}
			wantPlugins[volume.MetricPluginName(k.Volume)]++
			if e.spec.Pending != "" {
				wantPending++
			}
		}
		gotPlugins, gotPending := d.Stats()
		if !maps.Equal(gotPlugins, wantPlugins) || gotPending != wantPending {
			t.Fatalf("step %d: desired Stats() = %v, %d; a full count says %v, %d", step, gotPlugins, gotPending, wantPlugins, wantPending)
		}

		wantActual, wantStates, wantOldest := map[string]int{}, map[State]int{Attached: 0, Uncertain: 0, Detaching: 0}, time.Time{}
		for v, byNode := range a.volumes {
			wantActual[volume.MetricPluginName(v)] += len(byNode)
			for _, at := range byNode {
				wantStates[at.State]++
				if at.State == Uncertain && !at.AttachStarted.IsZero() && (wantOldest.IsZero() || at.AttachStarted.Before(wantOldest)) {
					wantOldest = at.AttachStarted
				}
			}
		}
		if got := a.Stats(); !maps.Equal(got, wantActual) {
			t.Fatalf("step %d: actual Stats() = %v; a full count says %v", step, got, wantActual)
		}
		if got, oldest := a.StateStats(); !maps.Equal(got, wantStates) || !oldest.Equal(wantOldest) {
			t.Fatalf("step %d: StateStats() = %v, %v; a full count says %v, %v", step, got, oldest, wantStates, wantOldest)
		}
	}
}
