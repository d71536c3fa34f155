package hollow

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The chaos run on hollow nodes (make chaos-hollow): HOLLOW_CHAOS_DURATION
// of churn and faults per controller; HOLLOW_CHAOS_SEED=N replays a
// schedule. Not in make test nor the full set.
const (
	chaosDurationEnv = "HOLLOW_CHAOS_DURATION"
	chaosSeedEnv     = "HOLLOW_CHAOS_SEED"
	chaosNodes       = 3
	chaosVolumes     = 8
	// chaosStep is the time between two actions.
	chaosStep = 2 * time.Second
	// chaosFault bounds how long a kubelet stays down or frozen.
	chaosFault = 15 * time.Second
)

// TestChaos: pods come and go on a few hollow nodes with ReadWriteOnce
// volumes while kubelets are killed and restarted, a kubelet is frozen
// (SIGSTOP: its node status stops, its process stays) and the controller
// is SIGKILLed and replaced. Checked at every poll, against what the real
// kubelets report: a volume a kubelet lists in volumesInUse is never
// detached (a volume is given to a new pod only once its last attachment is
// gone, so only the old pod can keep it there), and no volume is attached
// to two nodes. At the end, faults stop: every pod runs, names agree, and
// once every pod is deleted every volume is detached.
func TestChaos(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv(chaosDurationEnv))
	if err != nil || d <= 0 {
		t.Skipf("set %s (make chaos-hollow)", chaosDurationEnv)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s: %v", chaosSeedEnv, err)
		}
	}
	forEachController(t, func(t *testing.T, kind controllerKind) {
		t.Logf("seed %d (%s=%d replays it)", seed, chaosSeedEnv, seed)
		e := newEnv(t, kind, "chaos", chaosNodes)
		c := &chaos{
			e: e, rnd: rand.New(rand.NewPCG(seed, 0)),
			pods: map[string]int{}, podNode: map[string]string{},
			downUntil: map[int]time.Time{}, frozen: map[int]bool{},
			counts: map[string]int{}, seenHeld: map[string]bool{},
		}
		for i := range chaosVolumes {
			c.vols = append(c.vols, e.createVolume(fmt.Sprintf("v%d", i)))
		}
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			c.act()
			deadline := time.Now().Add(chaosStep)
			for time.Now().Before(deadline) {
				if err := c.check(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(pollInterval) // pacing the schedule, not waiting for a result
			}
		}
		c.heal()
		var steps []step
		for pod, vol := range c.pods {
			steps = append(steps, e.podRunning(pod), e.listedAttached(c.vols[vol], c.podNode[pod], true))
		}
		e.waitSteps("faults healed", time.Now(), c.check, steps...)
		e.checkNames()
		steps = nil
		for pod := range c.pods {
			e.deletePod(pod)
			steps = append(steps, e.podGone(pod))
		}
		for _, v := range c.vols {
			steps = append(steps, c.detachedEverywhere(v))
		}
		e.waitSteps("every pod deleted", time.Now(), c.check, steps...)
		t.Logf("actions: %v", c.counts)
	})
}

type chaos struct {
	e    *env
	rnd  *rand.Rand
	vols []csiVolume
	// pods are the pods created and not yet deleted, with their volume's
	// index; podNode their node.
	pods    map[string]int
	podNode map[string]string
	next    int
	// downUntil: kubelets stopped (killed or frozen) until then.
	downUntil map[int]time.Time
	frozen    map[int]bool
	counts    map[string]int
	// seenHeld are the VolumeAttachments seen attached since their volume
	// was last given to a pod: one gone while its kubelet still reports the
	// volume in use was detached under a mounted volume.
	seenHeld map[string]bool
}

// act heals what is due, then does one random action.
func (c *chaos) act() {
	e := c.e
	for i, until := range c.downUntil {
		if time.Now().After(until) {
			c.revive(i)
		}
	}
	switch r := c.rnd.IntN(10); {
	case r < 4:
		// A pod for a free volume: no pod uses it, no attachment left.
		free := c.rnd.IntN(len(c.vols))
		if slices.Contains(c.usedVolumes(), free) || !c.detached(c.vols[free]) {
			return
		}
		pod := fmt.Sprintf("p%d", c.next)
		c.next++
		node := e.node(c.rnd.IntN(chaosNodes))
		e.createPod(pod, node, c.vols[free].claim)
		c.pods[pod], c.podNode[pod] = free, node
		for _, n := range e.nodes {
			delete(c.seenHeld, c.vols[free].vaName(n.Name))
		}
		c.counts["create pod"]++
	case r < 6:
		if len(c.pods) == 0 {
			return
		}
		pods := make([]string, 0, len(c.pods))
		for p := range c.pods {
			pods = append(pods, p)
		}
		slices.Sort(pods)
		pod := pods[c.rnd.IntN(len(pods))]
		// The pod is gone once its kubelet unmounted; its volume is free
		// again once detached (usedVolumes reads the API).
		e.deletePod(pod)
		delete(c.pods, pod)
		c.counts["delete pod"]++
	case r < 7:
		i := c.rnd.IntN(chaosNodes)
		if _, down := c.downUntil[i]; down {
			return
		}
		if err := e.nodes[i].Kubelet().Kill(); err != nil {
			e.t.Fatal(err)
		}
		c.downUntil[i] = time.Now().Add(time.Duration(1+c.rnd.IntN(int(chaosFault/time.Second))) * time.Second)
		c.counts["kill kubelet"]++
	case r < 8:
		i := c.rnd.IntN(chaosNodes)
		if _, down := c.downUntil[i]; down {
			return
		}
		if err := e.nodes[i].Kubelet().Signal(syscall.SIGSTOP); err != nil {
			e.t.Fatal(err)
		}
		c.frozen[i] = true
		c.downUntil[i] = time.Now().Add(chaosFault)
		c.counts["freeze kubelet"]++
	default:
		if err := e.controllers[len(e.controllers)-1].Kill(); err != nil {
			e.t.Fatal(err)
		}
		e.startController()
		c.counts["kill controller"]++
	}
}

// revive restarts a killed kubelet or thaws a frozen one.
func (c *chaos) revive(i int) {
	if c.frozen[i] {
		if err := c.e.nodes[i].Kubelet().Signal(syscall.SIGCONT); err != nil {
			c.e.t.Fatal(err)
		}
		delete(c.frozen, i)
	} else if err := c.e.nodes[i].StartKubelet(c.e.ctx); err != nil {
		c.e.t.Fatal(err)
	}
	delete(c.downUntil, i)
}

// heal revives every kubelet.
func (c *chaos) heal() {
	for i := range c.downUntil {
		c.revive(i)
	}
}

// usedVolumes are the volumes of pods still in the API.
func (c *chaos) usedVolumes() []int {
	pods, err := c.e.client.CoreV1().Pods(c.e.ns).List(c.e.ctx, metav1.ListOptions{})
	if err != nil {
		c.e.t.Fatal(err)
	}
	var used []int
	for _, p := range pods.Items {
		for _, v := range p.Spec.Volumes {
			for i, vol := range c.vols {
				if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == vol.claim {
					used = append(used, i)
				}
			}
		}
	}
	return used
}

// detached says whether v has no VolumeAttachment on any node.
func (c *chaos) detached(v csiVolume) bool {
	for _, n := range c.e.nodes {
		_, err := c.e.client.StorageV1().VolumeAttachments().Get(c.e.ctx, v.vaName(n.Name), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false
		}
	}
	return true
}

func (c *chaos) detachedEverywhere(v csiVolume) step {
	return step{"no VolumeAttachment of " + v.handle, func() (bool, error) { return c.detached(v), nil }}
}

// check reads every VolumeAttachment, then every node's status: a volume
// whose attachment was seen attached and is now gone or going while a
// kubelet reports it in use, or a volume attached to two nodes, is a
// violation.
func (c *chaos) check() error {
	e := c.e
	vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	held := map[string]bool{} // VolumeAttachment names attached and not being deleted
	attachedTo := map[string][]string{}
	for _, va := range vas.Items {
		if va.Status.Attached && va.DeletionTimestamp == nil {
			held[va.Name] = true
			attachedTo[*va.Spec.Source.PersistentVolumeName] = append(attachedTo[*va.Spec.Source.PersistentVolumeName], va.Spec.NodeName)
		}
	}
	for name := range held {
		c.seenHeld[name] = true
	}
	for pv, nodes := range attachedTo {
		if len(nodes) > 1 {
			return fmt.Errorf("ReadWriteOnce volume %s attached to %v", pv, nodes)
		}
	}
	for _, n := range e.nodes {
		node, err := e.client.CoreV1().Nodes().Get(e.ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, v := range c.vols {
			if !slices.Contains(node.Status.VolumesInUse, v.name()) {
				continue
			}
			name := v.vaName(n.Name)
			if !held[name] && c.seenHeld[name] {
				return fmt.Errorf("%s detached from %s while its kubelet reports it in use", v.name(), n.Name)
			}
		}
	}
	return nil
}

// TestChaosCheckerCatchesDetach plants what the chaos run must catch: with
// no controller, the test attaches a volume a pod uses (it writes the
// VolumeAttachment; the real attacher attaches it), waits until the kubelet
// reports it in use, then deletes the VolumeAttachment under it. The
// checker must call that a violation.
func TestChaosCheckerCatchesDetach(t *testing.T) {
	fullSet(t)
	e := newEnv(t, noController, "chaoscheck", 1)
	node := e.node(0)
	v := e.createVolume("data")
	e.createPod("app", node, v.claim)
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: v.vaName(node)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: v.driver,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pv},
		},
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitSteps("attached", time.Now(), nil, e.vaAttached(v, node), e.listedInUse(v, node, true))
	c := &chaos{e: e, vols: []csiVolume{v}, seenHeld: map[string]bool{}}
	if err := c.check(); err != nil {
		t.Fatalf("checker before the planted detach: %v", err)
	}
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, va.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitSteps("detached under the kubelet", time.Now(), nil, e.vaGone(v, node), e.listedInUse(v, node, true))
	if err := c.check(); err == nil {
		t.Fatal("checker found nothing wrong with a volume detached while its kubelet reports it in use")
	} else {
		t.Logf("checker, as planted: %v", err)
	}
}
