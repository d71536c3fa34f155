package stack

// A whole cluster, as users run it
//
// StartCluster starts what a kubeadm-style cluster runs, on loopback, each
// component the real binary of Kubernetes v1.37.2 (hack/tools):
//
//	etcd, kube-apiserver          node lifecycle tolerations shortened (NodeLifecycle)
//	kube-scheduler                default profile: VolumeBinding, VolumeZone, ...
//	kube-controller-manager       --controllers=*,-attachdetach beside this controller
//	                              (--controllers=* for the control runs): PV binder,
//	                              StatefulSet, node lifecycle, pod GC, ephemeral volume,
//	                              PVC protection, namespace, garbage collector, ...
//	attach-detach-controller      this controller (AttachDetach: Ours)
//	per CSI driver                csi-mock-driver (zonal: Options.Topology), the real
//	                              csi-attacher and csi-provisioner on its socket
//	hollow nodes                  real kubelets, fake runtime, Nodes of them spread
//	                              over Zones zones (zone-a, zone-b, ...), each with a
//	                              csi-mock-driver per driver reporting the node's zone
//	StorageClass StorageClassName MockDriver, WaitForFirstConsumer, the default class
//
// Nothing plays another component's part: a test creates a StatefulSet and
// the scheduler picks a node, the PV controller and the provisioner create
// a PV in that node's zone and bind it, the attach/detach controller attaches
// it, the kubelet mounts it and runs the pod. A drain (Drain) evicts through
// the API, the StatefulSet controller re-creates the pod, the scheduler puts
// it in the volume's zone.
//
// A test package starts one cluster per configuration it needs (a start is
// about ten seconds) and isolates its tests by namespace; a test that stops a
// node or a controller starts a cluster of its own. Stop ends everything.
//
//	c, err := stack.StartCluster(ctx, stack.ClusterOptions{Nodes: 4, Zones: 2})
//	defer c.Stop()
//	sts := stack.StatefulSet(ns, "web", 3, c.StorageClass)
//	... c.Client.AppsV1().StatefulSets(ns).Create(ctx, sts, ...)
//	pods, err := stack.WaitStatefulSetRunning(ctx, c.Client, ns, "web", time.Minute)
//	err = stack.Drain(ctx, c.Client, pods[0].Spec.NodeName, stack.DrainOptions{})

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// AttachDetach names the attach/detach controller a cluster runs.
type AttachDetach string

const (
	// Ours is this controller's binary, kube-controller-manager running
	// with --controllers=*,-attachdetach beside it: how users deploy it.
	Ours AttachDetach = "adc"
	// KubeControllerManager is kube-controller-manager's own attachdetach
	// controller (--controllers=*), this controller not running: the
	// control a result of Ours is compared with.
	KubeControllerManager AttachDetach = "kcm"
)

// StorageClassName is the StorageClass StartCluster creates: MockDriver,
// volumeBindingMode WaitForFirstConsumer, reclaim Delete, the cluster's
// default class (a claim without storageClassName gets it).
const StorageClassName = "mock-wffc"

// ClusterOptions configure StartCluster. The zero value is a working
// configuration: three nodes in one zone, this controller attaching.
type ClusterOptions struct {
	// Options are the stack's: BinDir, the controller's binary, Drivers
	// (default here: MockDriver alone; MockDriver must be among them),
	// APIServerFlags (appended after the node lifecycle's), Logger.
	// Topology is set.
	Options
	// Nodes is the number of hollow nodes. Default 3.
	Nodes int
	// Zones spreads the nodes: node i is in zone ZoneName(i % Zones).
	// Default 1.
	Zones int
	// NodePrefix names the nodes NodePrefix0, NodePrefix1, ... Default
	// "node-".
	NodePrefix string
	// AttachDetach is the attach/detach controller. Default Ours.
	AttachDetach AttachDetach
	// LeaderElection runs kube-controller-manager, kube-scheduler and this
	// controller with leader election on (ElectionFlags), as production
	// control planes do; off, each runs alone without a Lease.
	LeaderElection bool
	// NodeLifecycle are the node lifecycle timings. Default:
	// ShortNodeLifecycle.
	NodeLifecycle *NodeLifecycle
	// ControllerArgs, ControllerManagerArgs, SchedulerArgs and KubeletArgs
	// are appended to the flags of this controller, kube-controller-manager,
	// kube-scheduler and every hollow node.
	ControllerArgs        []string
	ControllerManagerArgs []string
	SchedulerArgs         []string
	KubeletArgs           []string
}

// Cluster is a running cluster (StartCluster). Its Stack runs more on
// demand: StartHollowNodes, StartController, AddDriver, ...
type Cluster struct {
	*Stack
	// Client is the cluster admin's client.
	Client kubernetes.Interface
	// AttachDetach is the attach/detach controller running.
	AttachDetach AttachDetach
	// Nodes are the hollow nodes, node i in Zones[i % len(Zones)].
	Nodes []*HollowNode
	// Zones are the zones' names, ZoneName(0) ... ZoneName(Zones-1).
	Zones []string
	// StorageClass is StorageClassName.
	StorageClass string
	// Scheduler, ControllerManager and Provisioners (one per driver, in
	// the order of Drivers) are the processes of the control plane.
	Scheduler         *Process
	ControllerManager *Process
	Provisioners      []*Process
	// Controller is this controller; nil with KubeControllerManager.
	Controller *Controller

	opts ClusterOptions
}

// ClusterBinaries are the tools StartCluster runs from the bin directory
// (hack/build-tools.sh builds them), besides this controller and kubeletsim.
var ClusterBinaries = []string{
	"etcd", "kube-apiserver", KubeSchedulerBinary, KubeControllerManagerBinary,
	AttacherBinary, ProvisionerBinary, MockDriverBinary, HollowNodeBinary,
}

// MissingClusterBinaries lists the ClusterBinaries missing from o's bin
// directory: a test package skips when some are (make test-cluster builds
// them).
func MissingClusterBinaries(o Options) ([]string, error) {
	dir, err := o.binDir()
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, name := range ClusterBinaries {
		if checkBinary(filepath.Join(dir, name), "") != nil {
			missing = append(missing, filepath.Join(dir, name))
		}
	}
	return missing, nil
}

// ZoneName is the name of zone i: zone-a, zone-b, ...
func ZoneName(i int) string { return "zone-" + string(rune('a'+i)) }

func (o ClusterOptions) withDefaults() (ClusterOptions, error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Zones == 0 {
		o.Zones = 1
	}
	if o.NodePrefix == "" {
		o.NodePrefix = "node-"
	}
	if o.AttachDetach == "" {
		o.AttachDetach = Ours
	}
	if o.NodeLifecycle == nil {
		o.NodeLifecycle = &ShortNodeLifecycle
	}
	if len(o.Drivers) == 0 {
		o.Drivers = []string{MockDriver}
	}
	switch {
	case o.Nodes < 0:
		return o, fmt.Errorf("cluster: %d nodes", o.Nodes)
	case o.Zones < 0 || o.Zones > 26:
		return o, fmt.Errorf("cluster: %d zones, want 1 to 26", o.Zones)
	case o.AttachDetach != Ours && o.AttachDetach != KubeControllerManager:
		return o, fmt.Errorf("cluster: unknown attach/detach controller %q", o.AttachDetach)
	case !slices.Contains(o.Drivers, MockDriver):
		return o, fmt.Errorf("cluster: drivers %v lack %s, the driver of StorageClass %s", o.Drivers, MockDriver, StorageClassName)
	}
	return o, nil
}

// StartCluster starts a cluster (see the top of this file) and returns once
// every component is ready: each node Ready with its drivers in its CSINode,
// the controllers' caches synced. On error nothing is left running.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	started := time.Now()
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	stackOpts := o.Options
	stackOpts.Topology = true
	stackOpts.APIServerFlags = append(o.NodeLifecycle.APIServerFlags(), o.APIServerFlags...)
	st, err := Start(ctx, stackOpts)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Stack: st, Client: st.Cluster.Client, AttachDetach: o.AttachDetach, StorageClass: StorageClassName, opts: o}
	for i := range o.Zones {
		c.Zones = append(c.Zones, ZoneName(i))
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, st.Stop())
	}
	st.logger.Info("Cluster started", "attachDetach", o.AttachDetach, "nodes", o.Nodes, "zones", o.Zones,
		"leaderElection", o.LeaderElection, "duration", time.Since(started).Round(time.Millisecond))
	return c, nil
}

// start creates the storage objects and starts the components and the
// nodes side by side: each waits on its own readiness only.
func (c *Cluster) start(ctx context.Context) error {
	o := c.opts
	for _, d := range c.Drivers {
		if _, err := framework.CreateCSIDriver(ctx, c.Client, d, new(true)); err != nil {
			return err
		}
	}
	if err := createStorageClass(ctx, c.Client, StorageClassName, MockDriver); err != nil {
		return err
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	run := func(f func() error) {
		wg.Go(func() {
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	run(func() (err error) {
		c.Scheduler, err = c.StartScheduler(ctx, SchedulerOptions{LeaderElection: o.LeaderElection, Args: o.SchedulerArgs})
		return err
	})
	run(func() (err error) {
		c.ControllerManager, err = c.StartControllerManager(ctx, ControllerManagerOptions{
			AttachDetach:   o.AttachDetach == KubeControllerManager,
			LeaderElection: o.LeaderElection,
			NodeLifecycle:  o.NodeLifecycle,
			Args:           o.ControllerManagerArgs,
		})
		return err
	})
	c.Provisioners = make([]*Process, len(c.Drivers))
	for i, d := range c.Drivers {
		run(func() (err error) {
			c.Provisioners[i], err = c.StartProvisioner(ctx, d)
			return err
		})
	}
	if o.AttachDetach == Ours {
		run(func() (err error) {
			c.Controller, err = c.StartController(ctx, c.controllerArgs()...)
			return err
		})
	}
	run(func() (err error) {
		c.Nodes, err = c.StartHollowNodes(ctx, HollowNodesOptions{
			Count: o.Nodes, Zones: o.Zones, Prefix: o.NodePrefix, KubeletArgs: o.KubeletArgs,
		})
		return err
	})
	wg.Wait()
	return errors.Join(errs...)
}

// controllerArgs are this controller's flags in the cluster.
func (c *Cluster) controllerArgs() []string {
	var args []string
	if c.opts.LeaderElection {
		args = append(args, "--leader-elect=true")
		args = append(args, ElectionFlags...)
	}
	return append(args, c.opts.ControllerArgs...)
}

// RestartController stops this controller (SIGTERM) and starts another
// with the same flags; extraArgs are appended to them. It fails with
// KubeControllerManager attaching.
func (c *Cluster) RestartController(ctx context.Context, extraArgs ...string) (*Controller, error) {
	if c.Controller == nil {
		return nil, errors.New("cluster: this controller does not run here (AttachDetach is KubeControllerManager)")
	}
	if err := c.Controller.Stop(StopGrace); err != nil {
		return nil, err
	}
	ctrl, err := c.StartController(ctx, append(c.controllerArgs(), extraArgs...)...)
	if err != nil {
		return nil, err
	}
	c.Controller = ctrl
	return ctrl, nil
}

// AttachDetachProcess is the process that attaches and detaches: this
// controller, or kube-controller-manager.
func (c *Cluster) AttachDetachProcess() *Process {
	if c.Controller != nil {
		return c.Controller.Process
	}
	return c.ControllerManager
}

// Node is the hollow node called name, nil if there is none.
func (c *Cluster) Node(name string) *HollowNode {
	i := slices.IndexFunc(c.Nodes, func(n *HollowNode) bool { return n.Name == name })
	if i < 0 {
		return nil
	}
	return c.Nodes[i]
}

// ZoneOf is the zone of the hollow node called name, "" if there is none.
func (c *Cluster) ZoneOf(name string) string {
	i := slices.IndexFunc(c.Nodes, func(n *HollowNode) bool { return n.Name == name })
	if i < 0 {
		return ""
	}
	return c.Nodes[i].Zone
}

// NodesIn are the hollow nodes of zone.
func (c *Cluster) NodesIn(zone string) []*HollowNode {
	var out []*HollowNode
	for _, n := range c.Nodes {
		if n.Zone == zone {
			out = append(out, n)
		}
	}
	return out
}

// HollowNodesOptions configure StartHollowNodes.
type HollowNodesOptions struct {
	// Count nodes, named Prefix<First+i>, node i in zone
	// ZoneName((First+i) % Zones) (Zones 0: no zone label).
	Count  int
	First  int
	Prefix string
	Zones  int
	// KubeletArgs are appended to every node's flags.
	KubeletArgs []string
	// Customize, if set, changes node i's options before it starts.
	Customize func(i int, o *HollowNodeOptions)
}

// StartHollowNodes starts o.Count hollow nodes side by side, each with the
// stack's drivers reporting its zone, and returns them once each is Ready
// with its drivers registered. On error the nodes started are returned too
// (Stack.Stop stops them).
func (s *Stack) StartHollowNodes(ctx context.Context, o HollowNodesOptions) ([]*HollowNode, error) {
	nodes := make([]*HollowNode, o.Count)
	errs := make([]error, o.Count)
	var wg sync.WaitGroup
	for i := range o.Count {
		n := o.First + i
		ho := HollowNodeOptions{Name: fmt.Sprintf("%s%d", o.Prefix, n), KubeletArgs: o.KubeletArgs}
		if o.Zones > 0 {
			ho.Labels = map[string]string{v1.LabelTopologyZone: ZoneName(n % o.Zones)}
		}
		if o.Customize != nil {
			o.Customize(i, &ho)
		}
		wg.Go(func() { nodes[i], errs[i] = s.StartHollowNode(ctx, ho) })
	}
	wg.Wait()
	return slices.DeleteFunc(nodes, func(n *HollowNode) bool { return n == nil }), errors.Join(errs...)
}

// createStorageClass creates (or finds) a default StorageClass of driver
// with WaitForFirstConsumer binding, as clusters of zonal block storage
// configure theirs.
func createStorageClass(ctx context.Context, client kubernetes.Interface, name, driver string) error {
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	del := v1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       driver,
		VolumeBindingMode: &wait,
		ReclaimPolicy:     &del,
	}
	_, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create StorageClass %s: %w", name, err)
	}
	return nil
}
