package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
)

// csiPlugin starts the unique name of every CSI volume in node.status.
const csiPlugin = "kubernetes.io/csi/"

// Expectation is the state a controller must reach: which VolumeAttachments
// exist on a node set (no others), and what each node's
// status.volumesAttached lists (of the benchmark's driver).
type Expectation struct {
	driver     string
	namePrefix string
	nodes      map[string]map[v1.UniqueVolumeName]bool
	vas        map[string]bool
}

func newExpectation(driver string) *Expectation {
	return &Expectation{
		driver:     driver,
		namePrefix: csiPlugin + driver + "^",
		nodes:      map[string]map[v1.UniqueVolumeName]bool{},
		vas:        map[string]bool{},
	}
}

func (e *Expectation) addNode(node string) { e.nodes[node] = map[v1.UniqueVolumeName]bool{} }

func (e *Expectation) addVolume(handle, node string) {
	e.nodes[node][v1.UniqueVolumeName(e.namePrefix+handle)] = true
	// The name both controllers give it (ADC_CONTRACT.md), computed here
	// rather than taken from the code under test.
	e.vas[fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+e.driver+node)))] = true
}

// Volumes is the number of attachments expected.
func (e *Expectation) Volumes() int { return len(e.vas) }

// Snapshot is how far the cluster is from an Expectation.
type Snapshot struct {
	Expected int // VolumeAttachments expected
	Exist    int // of those, existing
	Attached int // of those, attached
	Extra    int // VolumeAttachments on the node set not expected
	Nodes    int // nodes in the set
	Exact    int // of those, whose status lists exactly the expected volumes
	Reported int // expected volumes listed in their node's status
}

// AllExist: every expected VolumeAttachment exists.
func (s Snapshot) AllExist() bool { return s.Exist == s.Expected }

// StatusExact: every node's status lists exactly its expected volumes.
func (s Snapshot) StatusExact() bool { return s.Exact == s.Nodes }

// NoExtra: no VolumeAttachment other than the expected ones is left.
func (s Snapshot) NoExtra() bool { return s.Extra == 0 }

// Converged: all of the above, and every expected volume attached.
func (s Snapshot) Converged() bool {
	return s.AllExist() && s.Attached == s.Expected && s.NoExtra() && s.StatusExact()
}

func (s Snapshot) String() string {
	return fmt.Sprintf("%d/%d VolumeAttachments exist, %d attached, %d not expected left; %d/%d volumes in node status, %d/%d nodes exact",
		s.Exist, s.Expected, s.Attached, s.Extra, s.Reported, s.Expected, s.Exact, s.Nodes)
}

// Observer watches VolumeAttachments and Nodes with the harness's own
// client and compares them with Expectations.
type Observer struct {
	// poll is how often Await compares: the resolution of the times
	// measured.
	poll    time.Duration
	factory informers.SharedInformerFactory
	vas     storagelisters.VolumeAttachmentLister
	nodes   corelisters.NodeLister
}

// StartObserver starts the informers and waits for their caches; Await
// compares every poll.
func StartObserver(ctx context.Context, client kubernetes.Interface, poll time.Duration) (*Observer, error) {
	f := informers.NewSharedInformerFactory(client, 0)
	o := &Observer{poll: poll, factory: f, vas: f.Storage().V1().VolumeAttachments().Lister(), nodes: f.Core().V1().Nodes().Lister()}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("observer: %v cache not synced: %w", typ, ctx.Err())
		}
	}
	return o, nil
}

// Stop stops the informers; ctx given to StartObserver must be cancelled first.
func (o *Observer) Stop() { o.factory.Shutdown() }

// Snapshot compares the cluster with e.
func (o *Observer) Snapshot(e *Expectation) Snapshot {
	s := Snapshot{Expected: len(e.vas), Nodes: len(e.nodes)}
	vas, _ := o.vas.List(labels.Everything())
	for _, va := range vas {
		if _, ours := e.nodes[va.Spec.NodeName]; !ours {
			continue
		}
		if !e.vas[va.Name] {
			s.Extra++
			continue
		}
		s.Exist++
		if va.Status.Attached {
			s.Attached++
		}
	}
	for name, want := range e.nodes {
		node, err := o.nodes.Get(name)
		if err != nil {
			continue
		}
		listed, hits := 0, 0
		for _, av := range node.Status.VolumesAttached {
			if !strings.HasPrefix(string(av.Name), e.namePrefix) {
				continue
			}
			listed++
			if want[av.Name] {
				hits++
			}
		}
		s.Reported += hits
		if listed == len(want) && hits == len(want) {
			s.Exact++
		}
	}
	return s
}

// Sample is how far the cluster was from an Expectation at one comparison.
type Sample struct {
	At                        time.Duration // from the start given to Await
	Exist, Attached, Reported int           // as in Snapshot
}

// Progress is the counts of an await over time: the first sample of each
// change, and of a run of equal counts also the last, which is all a step
// line needs. A burst of 100,000 volumes keeps a few thousand.
type Progress struct{ Samples []Sample }

func (p *Progress) add(at time.Duration, s Snapshot) {
	n := Sample{At: at, Exist: s.Exist, Attached: s.Attached, Reported: s.Reported}
	k := len(p.Samples)
	same := func(a Sample) bool { return a.Exist == n.Exist && a.Attached == n.Attached && a.Reported == n.Reported }
	if k >= 2 && same(p.Samples[k-1]) && same(p.Samples[k-2]) {
		p.Samples[k-1].At = at
		return
	}
	p.Samples = append(p.Samples, n)
}

// Milestone is a condition whose first time true is measured.
type Milestone struct {
	Name string
	Done func(Snapshot) bool
}

// AwaitAsync is Await in the background, for a phase that acts meanwhile:
// result waits for its answer; cancel stops it early (result still answers).
// A non-nil progress records the counts of every comparison; it may be read
// once result has answered.
func (o *Observer) AwaitAsync(ctx context.Context, e *Expectation, start time.Time, timeout time.Duration, progress *Progress, milestones ...Milestone) (result func() (map[string]time.Duration, error), cancel func()) {
	ctx, cancel = context.WithCancel(ctx)
	type awaited struct {
		times map[string]time.Duration
		err   error
	}
	done := make(chan awaited, 1)
	go func() {
		t, err := o.await(ctx, e, start, timeout, progress, milestones)
		done <- awaited{t, err}
	}()
	var a *awaited
	return func() (map[string]time.Duration, error) {
		if a == nil {
			got := <-done
			a = &got
		}
		return a.times, a.err
	}, cancel
}

// Await polls until every milestone is reached, and returns when each was
// first reached, relative to start. On timeout it returns the times of those
// reached and an error saying how far the cluster got.
func (o *Observer) Await(ctx context.Context, e *Expectation, start time.Time, timeout time.Duration, milestones ...Milestone) (map[string]time.Duration, error) {
	return o.await(ctx, e, start, timeout, nil, milestones)
}

func (o *Observer) await(ctx context.Context, e *Expectation, start time.Time, timeout time.Duration, progress *Progress, milestones []Milestone) (map[string]time.Duration, error) {
	reached := map[string]time.Duration{}
	deadline := start.Add(timeout)
	ticker := time.NewTicker(o.poll)
	defer ticker.Stop()
	for {
		s := o.Snapshot(e)
		now := time.Now()
		if progress != nil {
			progress.add(now.Sub(start), s)
		}
		for _, m := range milestones {
			if _, ok := reached[m.Name]; !ok && m.Done(s) {
				reached[m.Name] = now.Sub(start)
			}
		}
		if len(reached) == len(milestones) {
			return reached, nil
		}
		if now.After(deadline) {
			var missing []string
			for _, m := range milestones {
				if _, ok := reached[m.Name]; !ok {
					missing = append(missing, m.Name)
				}
			}
			return reached, fmt.Errorf("not reached after %s: %s; %s", timeout, strings.Join(missing, ", "), s)
		}
		select {
		case <-ctx.Done():
			return reached, fmt.Errorf("interrupted: %w; %s", context.Cause(ctx), s)
		case <-ticker.C:
		}
	}
}

// Listing is a volume awaited in a node's status.volumesAttached.
type Listing struct {
	Node   string
	Volume v1.UniqueVolumeName
}

// WatchListed records, every poll, when each listing is first seen in its
// node's status, until every one is or stop is called. stop returns those
// times, zero for a listing not seen; a phase calls it once it knows every
// listing it needs is in (its Await answered).
func (o *Observer) WatchListed(ctx context.Context, ls []Listing) (stop func() []time.Time) {
	ctx, cancel := context.WithCancel(ctx)
	seen := make([]time.Time, len(ls))
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(o.poll)
		defer ticker.Stop()
		for left := len(ls); left > 0; {
			now := time.Now()
			for i, l := range ls {
				if seen[i].IsZero() && o.listed(l) {
					seen[i] = now
					left--
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	return func() []time.Time {
		cancel()
		<-done
		// The last listings may have come after the last poll: the
		// phase's own wait, which ended it, saw them first.
		now := time.Now()
		for i, l := range ls {
			if seen[i].IsZero() && o.listed(l) {
				seen[i] = now
			}
		}
		return seen
	}
}

// listed reports whether l's node lists its volume in status.volumesAttached.
func (o *Observer) listed(l Listing) bool {
	node, err := o.nodes.Get(l.Node)
	if err != nil {
		return false
	}
	for _, av := range node.Status.VolumesAttached {
		if av.Name == l.Volume {
			return true
		}
	}
	return false
}
