package sim

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	csitrans "k8s.io/csi-translation-lib"
)

// Driver is one CSI driver registered in every node's CSINode.
type Driver struct {
	Name string
	// NodeID is the driver's ID of the node (what its NodeGetInfo
	// answers); empty gives one derived from the node's name, as a cloud's
	// instance ID is, and never the name itself.
	NodeID string
}

// AllMigratedPlugins are the in-tree plugins kubelet v1.37 lists as
// migrated on every CSINode, whatever driver is installed
// (pkg/volume/csi/csi_plugin.go): every plugin that can be translated.
var AllMigratedPlugins = []string{
	gcePDPluginName, awsEBSPluginName, cinderPluginName, azureDiskPluginName,
	azureFilePluginName, vspherePluginName, portworxPluginName,
}

// DefaultStatusUpdateFrequency is kubelet's nodeStatusUpdateFrequency.
const DefaultStatusUpdateFrequency = 10 * time.Second

// Options configure the simulator. The zero value is not usable: start
// from NewOptions.
type Options struct {
	Kubeconfig   string
	KubeAPIQPS   float64
	KubeAPIBurst int

	// Nodes are named NodePrefix + index, index from 0 to Nodes-1.
	Nodes      int
	NodePrefix string
	// NodeLabels are added to every node's labels when it registers, as
	// kubelet's --node-labels (e.g. topology.kubernetes.io/zone).
	NodeLabels map[string]string

	CSIDrivers []Driver
	// MigratedPlugins are the in-tree plugins written to every CSINode's
	// migrated-plugins annotation, whose volumes the nodes name by their
	// translated CSI volume. Default: AllMigratedPlugins, as kubelet v1.37;
	// fewer (or none) for an older kubelet.
	MigratedPlugins []string
	// CSINodeDelay is how long after the nodes the CSINodes are created;
	// 0 creates them with the nodes, a negative value never.
	CSINodeDelay time.Duration
	NoCSINode    bool
	// DriverRegistrationDelay is how long after its CSINode is created
	// the drivers register on a node (they are in spec.drivers, and their
	// node IDs in the Node's annotation, from then on).
	DriverRegistrationDelay time.Duration

	// StatusUpdateFrequency is how often each node's status loop runs: the
	// only writer of node.status.volumesInUse (kubelet's
	// nodeStatusUpdateFrequency, 10 s).
	StatusUpdateFrequency time.Duration
	// DeleteTerminatingPods: pods on the simulated nodes that have a
	// deletionTimestamp get phase Succeeded, their volumes are unmounted,
	// then they are deleted (grace period 0), as kubelet does.
	DeleteTerminatingPods bool
	Workers               int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		KubeAPIQPS:              50,
		KubeAPIBurst:            100,
		Nodes:                   1,
		NodePrefix:              "kubeletsim-node-",
		MigratedPlugins:         slices.Clone(AllMigratedPlugins),
		DriverRegistrationDelay: time.Second,
		StatusUpdateFrequency:   DefaultStatusUpdateFrequency,
		DeleteTerminatingPods:   true,
		Workers:                 4,
	}
}

// AddFlags registers the flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig; empty uses the in-cluster config.")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "QPS of the API client.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Burst of the API client.")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "Number of nodes to simulate.")
	fs.StringVar(&o.NodePrefix, "node-prefix", o.NodePrefix, "Node names are this prefix followed by 0 ... nodes-1.")
	fs.Var((*labelsFlag)(&o.NodeLabels), "node-labels", "Comma-separated labels (key=value) added to every node when it registers, as kubelet's --node-labels.")
	fs.Var((*driversFlag)(&o.CSIDrivers), "csi-drivers", "Comma-separated CSI drivers that register on every node, each name=nodeID, or name alone for a node ID the driver derives from the node's name (never the name itself).")
	fs.Var((*listFlag)(&o.MigratedPlugins), "migrated-plugins", "Comma-separated in-tree plugins (e.g. kubernetes.io/aws-ebs) the nodes handle through CSI: written to the CSINode annotation storage.alpha.kubernetes.io/migrated-plugins; their volumes are named by the translated CSI volume. Default: all seven, as kubelet v1.37 writes whatever is installed; fewer, or none, for an older kubelet.")
	fs.DurationVar(&o.CSINodeDelay, "csinode-delay", o.CSINodeDelay, "Create the CSINodes this long after the nodes; 0 with the nodes, negative never.")
	fs.BoolVar(&o.NoCSINode, "no-csinode", o.NoCSINode, "Never create CSINodes (as a negative --csinode-delay).")
	fs.DurationVar(&o.DriverRegistrationDelay, "driver-registration-delay", o.DriverRegistrationDelay, "How long after its CSINode is created (with no driver, as kubelet does at start) the CSI drivers register on a node.")
	fs.DurationVar(&o.StatusUpdateFrequency, "node-status-update-frequency", o.StatusUpdateFrequency, "How often each node's status loop runs, the only writer of node.status.volumesInUse (kubelet's nodeStatusUpdateFrequency). Tests may shorten it; the order of events stays kubelet's.")
	fs.BoolVar(&o.DeleteTerminatingPods, "delete-terminating-pods", o.DeleteTerminatingPods, "Finish the deletion of pods with a deletionTimestamp on the simulated nodes as kubelet does: phase Succeeded, volumes unmounted, then deleted (grace period 0).")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Nodes synced in parallel.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.Nodes < 1 {
		errs = append(errs, fmt.Errorf("--nodes must be >= 1, got %d", o.Nodes))
	}
	if o.Nodes >= 1 {
		last := NodeName(o.NodePrefix, o.Nodes-1)
		if msgs := validation.IsDNS1123Subdomain(last); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--node-prefix %q gives invalid node names (%s): %s", o.NodePrefix, last, strings.Join(msgs, "; ")))
		}
	}
	for k, v := range o.NodeLabels {
		if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--node-labels: invalid label %s=%s: %s", k, v, strings.Join(msgs, "; ")))
		}
	}
	seen := map[string]bool{}
	for _, d := range o.CSIDrivers {
		if msgs := validation.IsDNS1123Subdomain(d.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--csi-drivers: invalid driver name %q: %s", d.Name, strings.Join(msgs, "; ")))
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("--csi-drivers: driver %q given twice", d.Name))
		}
		seen[d.Name] = true
	}
	translator := csitrans.New()
	for _, p := range o.MigratedPlugins {
		if !translator.IsMigratableIntreePluginByName(p) {
			errs = append(errs, fmt.Errorf("--migrated-plugins: %q is not a migratable in-tree plugin", p))
		}
	}
	if o.StatusUpdateFrequency <= 0 {
		errs = append(errs, fmt.Errorf("--node-status-update-frequency must be positive, got %v", o.StatusUpdateFrequency))
	}
	if o.DriverRegistrationDelay < 0 {
		errs = append(errs, fmt.Errorf("--driver-registration-delay must not be negative, got %v", o.DriverRegistrationDelay))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers must be >= 1, got %d", o.Workers))
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps (%v) and --kube-api-burst (%d) must be positive", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	return errors.Join(errs...)
}

// csiNodes says whether and after which delay CSINodes are created.
func (o *Options) csiNodes() (delay time.Duration, create bool) {
	if o.NoCSINode || o.CSINodeDelay < 0 {
		return 0, false
	}
	return o.CSINodeDelay, true
}

// NodeName is the name of the i-th simulated node.
func NodeName(prefix string, i int) string {
	return fmt.Sprintf("%s%d", prefix, i)
}

// driversFlag parses "a=id1,b" into Drivers.
type driversFlag []Driver

func (f *driversFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, 0, len(*f))
	for _, d := range *f {
		if d.NodeID == "" {
			parts = append(parts, d.Name)
		} else {
			parts = append(parts, d.Name+"="+d.NodeID)
		}
	}
	return strings.Join(parts, ",")
}

func (f *driversFlag) Set(value string) error {
	var drivers []Driver
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, nodeID, _ := strings.Cut(item, "=")
		name, nodeID = strings.TrimSpace(name), strings.TrimSpace(nodeID)
		if name == "" {
			return fmt.Errorf("driver %q has no name", item)
		}
		drivers = append(drivers, Driver{Name: name, NodeID: nodeID})
	}
	*f = drivers
	return nil
}

// listFlag parses a comma-separated list.
type listFlag []string

func (f *listFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(*f, ",")
}

func (f *listFlag) Set(value string) error {
	var items []string
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	*f = items
	return nil
}

// labelsFlag parses "k1=v1,k2=v2" into a map.
type labelsFlag map[string]string

func (f *labelsFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, 0, len(*f))
	for k, v := range *f {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (f *labelsFlag) Set(value string) error {
	labels := map[string]string{}
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("label %q is not key=value", item)
		}
		labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	*f = labels
	return nil
}
