package stack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The rest of the control plane, as a cluster runs it beside this
// controller: kube-scheduler, kube-controller-manager with every controller
// on, and the CSI external-provisioner per driver. In BinDir
// (hack/build-tools.sh kube-scheduler kube-controller-manager
// csi-provisioner).
const (
	KubeSchedulerBinary    = "kube-scheduler"
	ProvisionerBinary      = "csi-provisioner"
	controlPlaneHint       = "make test-cluster, or hack/build-tools.sh kube-scheduler kube-controller-manager csi-provisioner"
	leaseNamespace         = "kube-system"
	schedulerLease         = "kube-scheduler"
	controllerManagerLease = "kube-controller-manager"
)

// NodeLifecycle are the timings of the node lifecycle: when a node that
// stops reporting is marked NotReady (its Ready condition Unknown) and
// tainted, and when its pods are evicted. kube-controller-manager's node
// lifecycle controller and kube-apiserver's DefaultTolerationSeconds
// admission plugin apply them, as in any cluster; only the durations differ.
type NodeLifecycle struct {
	// MonitorPeriod is how often the node lifecycle controller checks the
	// nodes (kube-controller-manager --node-monitor-period; upstream 5s).
	MonitorPeriod time.Duration
	// MonitorGracePeriod is how long a node may stop renewing its Lease
	// and status before it is marked NotReady and tainted
	// node.kubernetes.io/unreachable (--node-monitor-grace-period;
	// upstream 50s). A hollow kubelet renews its Lease every 10 s.
	MonitorGracePeriod time.Duration
	// NotReadyToleration and UnreachableToleration are the
	// tolerationSeconds every pod gets for the not-ready and unreachable
	// taints: how long its pods stay on a tainted node before they are
	// evicted (kube-apiserver --default-not-ready-toleration-seconds and
	// --default-unreachable-toleration-seconds; upstream 300s).
	NotReadyToleration    time.Duration
	UnreachableToleration time.Duration
}

var (
	// UpstreamNodeLifecycle are Kubernetes' defaults.
	UpstreamNodeLifecycle = NodeLifecycle{
		MonitorPeriod: 5 * time.Second, MonitorGracePeriod: 50 * time.Second,
		NotReadyToleration: 300 * time.Second, UnreachableToleration: 300 * time.Second,
	}
	// ShortNodeLifecycle is what tests run with: a node that stops is
	// NotReady after 20 s (two missed Lease renewals) and its pods are
	// evicted 30 s later.
	ShortNodeLifecycle = NodeLifecycle{
		MonitorPeriod: time.Second, MonitorGracePeriod: 20 * time.Second,
		NotReadyToleration: 30 * time.Second, UnreachableToleration: 30 * time.Second,
	}
)

// APIServerFlags are kube-apiserver's flags for l.
func (l NodeLifecycle) APIServerFlags() []string {
	return []string{
		"--default-not-ready-toleration-seconds=" + seconds(l.NotReadyToleration),
		"--default-unreachable-toleration-seconds=" + seconds(l.UnreachableToleration),
	}
}

// ControllerManagerFlags are kube-controller-manager's flags for l.
func (l NodeLifecycle) ControllerManagerFlags() []string {
	return []string{
		"--node-monitor-period=" + l.MonitorPeriod.String(),
		"--node-monitor-grace-period=" + l.MonitorGracePeriod.String(),
	}
}

func seconds(d time.Duration) string { return strconv.Itoa(int(d.Round(time.Second) / time.Second)) }

// ControllerManagerOptions configure StartControllerManager.
type ControllerManagerOptions struct {
	// AttachDetach runs kube-controller-manager's own attachdetach
	// controller (--controllers=*); false: --controllers=*,-attachdetach,
	// how it runs beside this controller.
	AttachDetach bool
	// LeaderElection on the Lease kube-system/kube-controller-manager, as
	// every production control plane runs it (ElectionFlags shorten it).
	LeaderElection bool
	// NodeLifecycle are its node lifecycle timings. Default:
	// ShortNodeLifecycle.
	NodeLifecycle *NodeLifecycle
	// Args are appended to the flags.
	Args []string
}

// ElectionFlags make a stopped leader's Lease expire in seconds: for
// kube-controller-manager, kube-scheduler and this controller alike.
var ElectionFlags = []string{"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s"}

// StartControllerManager starts kube-controller-manager as users run it:
// every controller on (the PersistentVolume binder, StatefulSet, node
// lifecycle, pod GC, ephemeral volume, PVC protection, ...), each with the
// service account credentials kube-controller-manager mints for it
// (--use-service-account-credentials), the service account key of the
// cluster, and its attachdetach controller off unless o.AttachDetach. It
// does not serve (--secure-port=0: no port to race for). It returns once
// the controllers run: for its attachdetach controller, once that one's
// caches are synced (framework.KubeControllerManagerSynced); with leader
// election, once it holds the Lease.
func (s *Stack) StartControllerManager(ctx context.Context, o ControllerManagerOptions) (*Process, error) {
	bin := filepath.Join(s.binDir, KubeControllerManagerBinary)
	if err := checkBinary(bin, controlPlaneHint); err != nil {
		return nil, err
	}
	flexDir, err := os.MkdirTemp(s.Cluster.Dir, "flexvolume-")
	if err != nil {
		return nil, err
	}
	lifecycle := ShortNodeLifecycle
	if o.NodeLifecycle != nil {
		lifecycle = *o.NodeLifecycle
	}
	controllers := "*,-attachdetach"
	if o.AttachDetach {
		controllers = "*"
	}
	args := []string{
		"--kubeconfig=" + s.Cluster.Kubeconfig,
		"--controllers=" + controllers,
		fmt.Sprintf("--leader-elect=%t", o.LeaderElection),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + s.Cluster.ServiceAccountKeyFile,
		"--secure-port=0",
		"--flex-volume-plugin-dir=" + flexDir,
		"--v=2",
	}
	if o.LeaderElection {
		args = append(args, ElectionFlags...)
	}
	args = append(args, lifecycle.ControllerManagerFlags()...)
	args = append(args, o.Args...)
	p, err := s.start(KubeControllerManagerBinary, bin, args...)
	if err != nil {
		return nil, err
	}
	err = p.WaitFor(ctx, startTimeout, "controllers of "+p.Name, func(ctx context.Context) (bool, error) {
		log := p.Tail(1 << 22)
		if o.AttachDetach && !framework.KubeControllerManagerSynced(log) {
			return false, nil
		}
		if o.LeaderElection {
			return s.leaseHeld(ctx, controllerManagerLease)
		}
		// Every controller starts at once, once the informers run; the
		// service account controller's first act, the default account of
		// the default namespace, says they are past their caches.
		if !strings.Contains(log, `"Starting stateful set controller"`) {
			return false, nil
		}
		_, err := s.Cluster.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return p, err
	}
	s.logger.V(1).Info("kube-controller-manager started", "controllers", controllers, "leaderElection", o.LeaderElection, "pid", p.Pid(), "log", p.LogPath)
	return p, nil
}

// SchedulerOptions configure StartScheduler.
type SchedulerOptions struct {
	// LeaderElection on the Lease kube-system/kube-scheduler.
	LeaderElection bool
	// Args are appended to the flags.
	Args []string
}

// StartScheduler starts kube-scheduler with its default profile: the
// VolumeBinding plugin waits for WaitForFirstConsumer claims to be
// provisioned in a zone the pod's node is in, the VolumeRestrictions and
// VolumeZone plugins apply. It does not serve (--secure-port=0). It returns
// once its event handlers have synced (with leader election, once it
// holds the Lease too): a pod created after is scheduled at once.
func (s *Stack) StartScheduler(ctx context.Context, o SchedulerOptions) (*Process, error) {
	bin := filepath.Join(s.binDir, KubeSchedulerBinary)
	if err := checkBinary(bin, controlPlaneHint); err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + s.Cluster.Kubeconfig,
		fmt.Sprintf("--leader-elect=%t", o.LeaderElection),
		"--secure-port=0",
		// v3: "Handlers synced", the readiness below.
		"--v=3",
	}
	if o.LeaderElection {
		args = append(args, ElectionFlags...)
	}
	args = append(args, o.Args...)
	p, err := s.start(KubeSchedulerBinary, bin, args...)
	if err != nil {
		return nil, err
	}
	err = p.WaitFor(ctx, startTimeout, "handlers of "+p.Name, func(ctx context.Context) (bool, error) {
		if !strings.Contains(p.Tail(1<<22), `"Handlers synced"`) {
			return false, nil
		}
		if o.LeaderElection {
			return s.leaseHeld(ctx, schedulerLease)
		}
		return true, nil
	})
	if err != nil {
		return p, err
	}
	s.logger.V(1).Info("kube-scheduler started", "leaderElection", o.LeaderElection, "pid", p.Pid(), "log", p.LogPath)
	return p, nil
}

// StartProvisioner starts the CSI external-provisioner on driver's
// controller socket, as a CSI driver's controller Deployment runs it
// beside the attacher: topology on (--feature-gates=Topology=true: a
// WaitForFirstConsumer claim is created in the selected node's zone),
// --extra-create-metadata, no leader election (one replica). The driver
// must be one the stack serves. It returns once the provisioner's
// controller runs.
func (s *Stack) StartProvisioner(ctx context.Context, driver string) (*Process, error) {
	bin := filepath.Join(s.binDir, ProvisionerBinary)
	if err := checkBinary(bin, controlPlaneHint); err != nil {
		return nil, err
	}
	p, err := s.start("csi-provisioner-"+driver, bin,
		"--csi-address="+s.driverSocket(driver),
		"--kubeconfig="+s.Cluster.Kubeconfig,
		"--feature-gates=Topology=true",
		"--leader-election=false",
		"--extra-create-metadata",
		// As for the attacher: the provisioner is not what a test
		// measures, and a failure at start is retried in seconds.
		"--kube-api-qps=50", "--kube-api-burst=100",
		"--retry-interval-max=5s",
		"-v=2")
	if err != nil {
		return nil, err
	}
	err = p.WaitFor(ctx, startTimeout, "start of "+p.Name, func(context.Context) (bool, error) {
		return strings.Contains(p.Tail(1<<20), `"Started provisioner controller"`), nil
	})
	if err != nil {
		return p, err
	}
	s.logger.V(1).Info("csi-provisioner started", "driver", driver, "pid", p.Pid(), "log", p.LogPath)
	return p, nil
}

// leaseHeld says whether the Lease kube-system/name has a holder.
func (s *Stack) leaseHeld(ctx context.Context, name string) (bool, error) {
	l, err := s.Cluster.Client.CoordinationV1().Leases(leaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get Lease %s/%s: %w", leaseNamespace, name, err)
	}
	return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
}
