// Command hollow-node runs the real kubelet of k8s.io/kubernetes (the release
// hack/tools/go.mod pins) the way kubemark's hollow node does: a fake container
// runtime, a fake mounter and a stub container manager, so that pods "run"
// without containers. Unlike kubemark's, it leaves controller attach/detach
// on, as every production kubelet has it: the node carries the
// volumes.kubernetes.io/controller-managed-attach-detach annotation, waits
// for the attach/detach controller to list a volume in
// node.status.volumesAttached before it mounts it, and reports what it mounts
// in node.status.volumesInUse. Its volume plugins are kubemark's: CSI (a CSI
// driver registers through <root-dir>/plugins_registry), iSCSI, FC, NFS,
// local, and the pod-level ones.
//
// Everything that differs between two nodes comes from flags (node name,
// labels, root directory, ports), so several hollow nodes run on one machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/kubelet"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	containertest "k8s.io/kubernetes/pkg/kubelet/container/testing"
	probetest "k8s.io/kubernetes/pkg/kubelet/prober/testing"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
	kubeletutil "k8s.io/kubernetes/pkg/kubelet/util"
	"k8s.io/kubernetes/pkg/util/oom"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/configmap"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/downwardapi"
	"k8s.io/kubernetes/pkg/volume/emptydir"
	"k8s.io/kubernetes/pkg/volume/fc"
	"k8s.io/kubernetes/pkg/volume/hostpath"
	"k8s.io/kubernetes/pkg/volume/iscsi"
	"k8s.io/kubernetes/pkg/volume/local"
	"k8s.io/kubernetes/pkg/volume/nfs"
	"k8s.io/kubernetes/pkg/volume/projected"
	"k8s.io/kubernetes/pkg/volume/secret"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/kubernetes/pkg/volume/util/subpath"
	"k8s.io/mount-utils"
)

// options are the command line flags.
type nodeOptions struct {
	kubeconfig         string
	nodeName           string
	labels             string
	rootDir            string
	port               int
	readOnlyPort       int
	healthzPort        int
	maxPods            int
	statusUpdatePeriod time.Duration
	syncPeriod         time.Duration
	apiQPS             float64
	apiBurst           int
}

func (o *nodeOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig of the API server (required).")
	fs.StringVar(&o.nodeName, "name", "", "Node name (required).")
	fs.StringVar(&o.labels, "node-labels", "", "Labels the node registers with, k=v,k2=v2 (e.g. topology.kubernetes.io/zone=a).")
	fs.StringVar(&o.rootDir, "root-dir", "", "Kubelet's root directory, one per node (required). CSI drivers register through <root-dir>/plugins_registry. Unix sockets live under it: keep it short.")
	fs.IntVar(&o.port, "port", 0, "Port of the kubelet's API (plain HTTP, no authentication); 0: not served.")
	fs.IntVar(&o.readOnlyPort, "read-only-port", 0, "Kubelet's read-only port; 0: not served.")
	fs.IntVar(&o.healthzPort, "healthz-port", 0, "Port of /healthz on 127.0.0.1; 0: not served.")
	fs.IntVar(&o.maxPods, "max-pods", 110, "Pods the node takes.")
	fs.DurationVar(&o.statusUpdatePeriod, "node-status-update-frequency", 10*time.Second, "How often the kubelet computes node status (volumesInUse among it) and writes it when it changed; kubelet's default.")
	fs.DurationVar(&o.syncPeriod, "sync-frequency", 10*time.Second, "Pod sync period.")
	fs.Float64Var(&o.apiQPS, "kube-api-qps", 50, "QPS to the API server.")
	fs.IntVar(&o.apiBurst, "kube-api-burst", 100, "Burst to the API server.")
}

func (o *nodeOptions) validate() error {
	var errs []error
	if o.kubeconfig == "" {
		errs = append(errs, errors.New("--kubeconfig is required"))
	}
	if o.nodeName == "" {
		errs = append(errs, errors.New("--name is required"))
	}
	if o.rootDir == "" {
		errs = append(errs, errors.New("--root-dir is required"))
	}
	if _, err := parseLabels(o.labels); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-labels: %q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

func main() {
	fs := flag.NewFlagSet(filepath.Base(os.Args[0]), flag.ExitOnError)
	var opts nodeOptions
	opts.addFlags(fs)
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		fs.Usage()
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithValues("node", opts.nodeName)
	ctx = klog.NewContext(ctx, logger)

	err := run(ctx, opts)
	if err != nil {
		logger.Error(err, "hollow-node failed")
	}
	klog.Flush()
	if err != nil {
		os.Exit(1)
	}
}

// run starts the kubelet and returns when ctx is cancelled. The kubelet's
// own goroutines do not stop with ctx; the process exits right after.
func run(ctx context.Context, opts nodeOptions) error {
	logger := klog.FromContext(ctx)
	rootDir, err := filepath.Abs(opts.rootDir)
	if err != nil {
		return fmt.Errorf("root directory %s: %w", opts.rootDir, err)
	}
	podLogsDir := filepath.Join(rootDir, "pod-logs")
	for _, dir := range []string{rootDir, podLogsDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	labels, _ := parseLabels(opts.labels)

	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", opts.kubeconfig, err)
	}
	restConfig.UserAgent = "hollow-kubelet/" + opts.nodeName
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS = float32(opts.apiQPS)
	restConfig.Burst = opts.apiBurst
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	flags, config, err := kubeletConfig(opts, rootDir, podLogsDir, labels)
	if err != nil {
		return err
	}

	// The heartbeat (lease and status) gives up before the next one is due,
	// as kubelet's own does.
	heartbeatConfig := *restConfig
	heartbeatConfig.Timeout = min(config.NodeStatusUpdateFrequency.Duration, time.Duration(config.NodeLeaseDurationSeconds)*time.Second)
	heartbeatConfig.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return fmt.Errorf("create heartbeat client: %w", err)
	}

	// The fake runtime serves CRI on a socket of this node's own.
	runtimeEndpoint := "unix://" + filepath.Join(rootDir, "cri.sock")
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(runtimeEndpoint); err != nil {
		return fmt.Errorf("start fake container runtime on %s: %w", runtimeEndpoint, err)
	}
	defer fakeRuntime.Stop()
	runtimeService, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(runtimeEndpoint).
		WithConnectionTimeout(15 * time.Second).
		Build(ctx)
	if err != nil {
		return fmt.Errorf("connect to fake container runtime: %w", err)
	}

	deps := &kubelet.Dependencies{
		KubeClient:                client,
		HeartbeatClient:           heartbeatClient,
		ProbeManager:              probetest.FakeManager{},
		RemoteRuntimeService:      runtimeService,
		RemoteImageService:        fakeRuntime.ImageService,
		CAdvisorInterface:         &cadvisortest.Fake{NodeName: opts.nodeName},
		OSInterface:               &containertest.FakeOS{},
		ContainerManager:          cm.NewStubContainerManager(),
		VolumePlugins:             volumePlugins(),
		OOMAdjuster:               oom.NewFakeOOMAdjuster(),
		Mounter:                   &mount.FakeMounter{},
		Subpather:                 &subpath.FakeSubpath{},
		HostUtil:                  hostutil.NewFakeHostUtil(nil),
		PodStartupLatencyTracker:  kubeletutil.NewPodStartupLatencyTracker(),
		NodeStartupLatencyTracker: kubeletutil.NewNodeStartupLatencyTracker(logger),
		TracerProvider:            noopoteltrace.NewTracerProvider(),
		// A real recorder reads /dev/kmsg for OOM events.
		Recorder: &record.FakeRecorder{},
	}

	logger.Info("Starting hollow kubelet", "rootDir", rootDir, "labels", labels, "attachDetachController", config.EnableControllerAttachDetach)
	if err := kubeletapp.RunKubelet(ctx, &options.KubeletServer{KubeletFlags: *flags, KubeletConfiguration: *config}, deps); err != nil {
		return fmt.Errorf("run kubelet: %w", err)
	}
	<-ctx.Done()
	logger.Info("Stopping hollow kubelet")
	return nil
}

// kubeletConfig is kubelet's default configuration with kubemark's changes
// for a process without containers, and controller attach/detach on.
func kubeletConfig(opts nodeOptions, rootDir, podLogsDir string, labels map[string]string) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration, error) {
	f := options.NewKubeletFlags()
	f.RootDirectory = rootDir
	f.CertDirectory = filepath.Join(rootDir, "pki")
	f.HostnameOverride = opts.nodeName
	f.NodeLabels = labels
	f.MinimumGCAge = metav1.Duration{Duration: time.Minute}
	f.MaxContainerCount = 100
	f.MaxPerPodContainerCount = 2
	if err := options.ValidateKubeletFlags(f); err != nil {
		return nil, nil, fmt.Errorf("kubelet flags: %w", err)
	}

	c, err := options.NewKubeletConfiguration()
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet configuration defaults: %w", err)
	}
	c.EnableControllerAttachDetach = true
	c.EnableServer = opts.port > 0
	c.Address = "127.0.0.1"
	c.Port = int32(opts.port)
	c.ReadOnlyPort = int32(opts.readOnlyPort)
	c.HealthzBindAddress = "127.0.0.1"
	c.HealthzPort = int32(opts.healthzPort)
	c.StaticPodPath = ""
	c.StaticPodURL = ""
	c.PodLogsDir = podLogsDir
	c.FileCheckFrequency.Duration = 20 * time.Second
	c.HTTPCheckFrequency.Duration = 20 * time.Second
	c.NodeStatusUpdateFrequency.Duration = opts.statusUpdatePeriod
	c.NodeStatusReportFrequency.Duration = 5 * time.Minute
	c.SyncFrequency.Duration = opts.syncPeriod
	c.EvictionPressureTransitionPeriod.Duration = 5 * time.Minute
	c.MaxPods = int32(opts.maxPods)
	c.PodsPerCore = 0
	c.ClusterDNS = []string{}
	c.ImageGCHighThresholdPercent = 90
	c.ImageGCLowThresholdPercent = 80
	c.ProviderID = "hollow://" + opts.nodeName
	c.VolumeStatsAggPeriod.Duration = time.Minute
	c.CgroupRoot = ""
	c.CgroupsPerQOS = false
	c.KubeletCgroups = "/kubelet"
	c.SystemCgroups = ""
	c.CPUCFSQuota = true
	c.EnableDebuggingHandlers = true
	c.HairpinMode = kubeletconfig.HairpinVeth
	c.MaxOpenFiles = 1024
	c.RegistryBurst = 10
	c.RegistryPullQPS = 5.0
	c.ResolverConfig = kubetypes.ResolvConfDefault
	c.SerializeImagePulls = true
	c.ProtectKernelDefaults = false
	c.RegisterNode = true
	c.LocalStorageCapacityIsolation = true
	return f, c, nil
}

// volumePlugins are kubemark's: what a kubelet without a host can set up.
func volumePlugins() []volume.VolumePlugin {
	var plugins []volume.VolumePlugin
	plugins = append(plugins, emptydir.ProbeVolumePlugins()...)
	plugins = append(plugins, hostpath.FakeProbeVolumePlugins(volume.VolumeConfig{})...)
	plugins = append(plugins, nfs.ProbeVolumePlugins(volume.VolumeConfig{})...)
	plugins = append(plugins, secret.ProbeVolumePlugins()...)
	plugins = append(plugins, iscsi.ProbeVolumePlugins()...)
	plugins = append(plugins, downwardapi.ProbeVolumePlugins()...)
	plugins = append(plugins, fc.ProbeVolumePlugins()...)
	plugins = append(plugins, configmap.ProbeVolumePlugins()...)
	plugins = append(plugins, projected.ProbeVolumePlugins()...)
	plugins = append(plugins, local.ProbeVolumePlugins()...)
	plugins = append(plugins, csi.ProbeVolumePlugins()...)
	return plugins
}
