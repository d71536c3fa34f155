package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// namespace holds the bench's StatefulSets.
	namespace = "bench"
	// scaled is the StatefulSet scaled up and down; drained the one whose
	// node is drained.
	scaled  = "web"
	drained = "db"
)

// result is one cluster's run.
type result struct {
	kind         stack.AttachDetach
	round        int
	dir          string
	clusterStart time.Duration

	scaleUp phase
	// skipped are the scale-up's pods a kubelet skipped for a claim not
	// Bound yet (kubeletSkips); unskipped is the scale-up without them.
	skipped   map[string]bool
	unskipped phase
	scaleDown phase
	drain     phase
	// drainNode is the drained node; drainReturned the time stack.Drain
	// took (every pod evicted and gone).
	drainNode     string
	drainReturned time.Duration
	moves         []moved

	load load
}

// phase is one phase's pods and its length: from its start until the
// last pod's last milestone (Running, or its volume detached).
type phase struct {
	started time.Time
	names   []string // of the pods
	pods    []times
	took    time.Duration
}

// runCluster starts a cluster with kind attaching, runs the phases in it,
// keeps its logs and milestones in dir, and stops it.
func runCluster(ctx context.Context, logger klog.Logger, o options, kind stack.AttachDetach, dir string) (res *result, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res = &result{kind: kind, dir: dir}
	sampler := startLoad(ctx, 2*time.Second)
	defer func() { res.load = sampler.stop() }()

	started := time.Now()
	c, err := stack.StartCluster(ctx, stack.ClusterOptions{
		Options: stack.Options{
			BinDir: o.binDir, ControllerBinary: o.controllerBin, KubeletsimBinary: o.kubeletsimBin, Logger: logger,
		},
		Nodes:        o.nodes,
		Zones:        o.zones,
		AttachDetach: kind,
		// kube-controller-manager's flags apply to each of its controllers'
		// clients: the same budget in both clusters.
		ControllerArgs:        o.budgetArgs(),
		ControllerManagerArgs: o.budgetArgs(),
	})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, keepLogs(c, dir), c.Stop()) }()
	res.clusterStart = time.Since(started)
	fmt.Printf("  cluster started in %s\n", res.clusterStart.Round(time.Second))

	// The bench's own client: its reads must not be what limits the run.
	config := rest.CopyConfig(c.Cluster.Config)
	config.QPS, config.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if _, err := framework.CreateNamespace(ctx, client, namespace); err != nil {
		return nil, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	tl := newTimeline()
	if err := tl.watch(watchCtx, client, namespace); err != nil {
		return nil, err
	}
	b := &bench{o: o, c: c, client: client, tl: tl}
	for _, p := range []struct {
		name string
		run  func(context.Context, *result) error
	}{
		{"scale-up", b.scaleUp},
		{"scale-down", b.scaleDown},
		{"drain", b.drain},
	} {
		if err := p.run(ctx, res); err != nil {
			return res, fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return res, writeMilestones(filepath.Join(dir, "milestones.csv"), res)
}

// bench runs the phases in one cluster.
type bench struct {
	o      options
	c      *stack.Cluster
	client kubernetes.Interface
	tl     *timeline
}

// scaleUp creates the StatefulSet with no pod, scales it to o.replicas and
// waits until every pod is Running and Ready.
func (b *bench) scaleUp(ctx context.Context, res *result) error {
	sts := stack.StatefulSet(namespace, scaled, 0, b.c.StorageClass)
	sts.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
	if _, err := b.client.AppsV1().StatefulSets(namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create StatefulSet %s: %w", scaled, err)
	}
	if _, err := stack.WaitStatefulSetRunning(ctx, b.client, namespace, scaled, b.o.timeout); err != nil {
		return err
	}
	fmt.Printf("  scale-up: %s 0 -> %d\n", scaled, b.o.replicas)
	res.scaleUp.started = time.Now()
	if err := stack.ScaleStatefulSet(ctx, b.client, namespace, scaled, int32(b.o.replicas)); err != nil {
		return err
	}
	err := b.wait(ctx, "pods Running", b.o.replicas, func() int {
		return b.tl.count(func(p *podFacts) bool {
			_, ok := ordinalOf(scaled, p.name)
			return ok && !p.running.IsZero() && p.deleting.IsZero()
		})
	})
	if err != nil {
		return err
	}
	if _, err := stack.WaitStatefulSetRunning(ctx, b.client, namespace, scaled, b.o.timeout); err != nil {
		return err
	}
	res.scaleUp.names, res.scaleUp.pods = b.tl.startTimes(namespace, scaled, b.o.replicas)
	res.scaleUp.took = since(res.scaleUp.started, res.scaleUp.pods, mRunning)
	skipped, err := kubeletSkips(b.c.Cluster.Dir, namespace)
	if err != nil {
		return fmt.Errorf("read the kubelets' logs: %w", err)
	}
	res.skipped = skipped
	res.unskipped = res.scaleUp.without(skipped)
	return nil
}

// scaleDown scales the StatefulSet to 0 and waits until every
// VolumeAttachment is gone: its volumes detached.
func (b *bench) scaleDown(ctx context.Context, res *result) error {
	fmt.Printf("  scale-down: %s %d -> 0\n", scaled, b.o.replicas)
	res.scaleDown.started = time.Now()
	if err := stack.ScaleStatefulSet(ctx, b.client, namespace, scaled, 0); err != nil {
		return err
	}
	err := b.wait(ctx, "VolumeAttachments gone", b.o.replicas, func() int {
		return b.tl.countVAs(func(_ vaKey, va *vaFacts) bool { return !va.gone.IsZero() })
	})
	if err != nil {
		return err
	}
	res.scaleDown.names, res.scaleDown.pods = b.tl.stoppedTimes(namespace, scaled, res.scaleDown.started)
	res.scaleDown.took = since(res.scaleDown.started, res.scaleDown.pods, mDetached)
	return nil
}

// drain puts o.drainPods pods of a second StatefulSet on the first node
// (every other node cordoned while they start), then drains that node and
// waits until every pod runs again on another node.
func (b *bench) drain(ctx context.Context, res *result) error {
	target := b.c.Nodes[0].Name
	var others []string
	for _, n := range b.c.Nodes[1:] {
		others = append(others, n.Name)
	}
	for _, n := range others {
		if err := stack.Cordon(ctx, b.client, n); err != nil {
			return err
		}
	}
	fmt.Printf("  drain: %d pods of %s on %s\n", b.o.drainPods, drained, target)
	sts := stack.StatefulSet(namespace, drained, int32(b.o.drainPods), b.c.StorageClass)
	sts.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
	if _, err := b.client.AppsV1().StatefulSets(namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create StatefulSet %s: %w", drained, err)
	}
	pods, err := stack.WaitStatefulSetRunning(ctx, b.client, namespace, drained, b.o.timeout)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if p.Spec.NodeName != target {
			return fmt.Errorf("pod %s on %s, want %s (the other nodes are cordoned)", p.Name, p.Spec.NodeName, target)
		}
	}
	for _, n := range others {
		if err := stack.Uncordon(ctx, b.client, n); err != nil {
			return err
		}
	}
	res.drainNode = target
	res.drain.started = time.Now()
	evicted, err := stack.Drain(ctx, b.client, target, stack.DrainOptions{Timeout: b.o.timeout})
	if err != nil {
		return err
	}
	res.drainReturned = time.Since(res.drain.started)
	uids := make([]types.UID, 0, len(evicted))
	for _, p := range evicted {
		uids = append(uids, p.UID)
	}
	err = b.wait(ctx, "drained pods Running again", len(uids), func() int {
		return b.tl.count(func(p *podFacts) bool {
			_, ok := ordinalOf(drained, p.name)
			return ok && !slices.Contains(uids, p.uid) && !p.running.IsZero() && p.deleting.IsZero()
		})
	})
	if err != nil {
		return err
	}
	if _, err := stack.WaitStatefulSetRunning(ctx, b.client, namespace, drained, b.o.timeout); err != nil {
		return err
	}
	res.moves = b.tl.moveTimes(namespace, drained, uids)
	for _, m := range res.moves {
		res.drain.names = append(res.drain.names, m.pod)
		res.drain.pods = append(res.drain.pods, m.times)
	}
	res.drain.took = since(res.drain.started, res.drain.pods, mRunning)
	return nil
}

// wait polls count until it reaches n, printing progress.
func (b *bench) wait(ctx context.Context, what string, n int, count func() int) error {
	deadline := time.Now().Add(b.o.timeout)
	last := time.Now()
	for {
		got := count()
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d after %s", what, got, n, b.o.timeout)
		}
		if time.Since(last) >= 10*time.Second {
			fmt.Printf("  %s: %d of %d\n", what, got, n)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// since is the time from start to the latest m among pods; 0 if a pod
// lacks it.
func since(start time.Time, pods []times, m milestone) time.Duration {
	end, ok := latest(pods, m)
	if !ok {
		return 0
	}
	return end.Sub(start)
}

// keepLogs copies every log of the cluster's directory into dir: the
// cluster's directory goes with it.
func keepLogs(c *stack.Cluster, dir string) error {
	logs, err := filepath.Glob(filepath.Join(c.Cluster.Dir, "*.log"))
	if err != nil {
		return err
	}
	var errs []error
	for _, src := range logs {
		errs = append(errs, copyFile(src, filepath.Join(dir, filepath.Base(src))))
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read only
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	_, err = io.Copy(out, in)
	return err
}
