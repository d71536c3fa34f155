// Package app wires the attach-detach-controller binary: flags, clients,
// leader election, the HTTP endpoint and the controller.
package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
	componentbaseconfig "k8s.io/component-base/config"
	"k8s.io/component-base/config/options"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/migration"
)

// DefaultLeaseName is the default --leader-elect-resource-name.
const DefaultLeaseName = "attach-detach-controller"

// Options are the command line settings.
type Options struct {
	Kubeconfig string
	QPS        float32
	Burst      int

	Logs           *logsapi.LoggingConfiguration
	LeaderElection componentbaseconfig.LeaderElectionConfiguration
	HTTPEndpoint   string
	// Serving is the secure endpoint (HTTPS, delegated authentication and
	// authorization: pkg/server), given by the command; nil serves none.
	Serving SecureServing

	ReconcileSyncPeriod         time.Duration
	DisableReconcileSync        bool
	DisableForceDetachOnTimeout bool
	MaxWaitForUnmount           time.Duration
	// UnhealthyZoneThreshold and UnhealthyZoneMinNodes say when a zone is
	// disrupted and its forced detaches by timeout are held
	// (reconciler.ZoneDisrupted), unless DisableZoneDisruptionGuard.
	UnhealthyZoneThreshold     float64
	UnhealthyZoneMinNodes      int
	DisableZoneDisruptionGuard bool
	Workers                    int
	OtherWriterCheckPeriod     time.Duration
	// HandoffTimeout bounds the handoff on SIGTERM (pkg/cache/handoff.go).
	HandoffTimeout time.Duration
	// CSIMigration is the CSI migration policy (migration.Policies).
	CSIMigration string
	// MaxWaitForUnmountDeletedNode is the wait on a node whose Node object
	// is gone; nil: MaxWaitForUnmount.
	MaxWaitForUnmountDeletedNode *time.Duration
	// Shadow runs the controller beside another attach/detach controller,
	// comparing and writing nothing (pkg/shadow); ShadowGracePeriod is how
	// long a disagreement lasts before it is reported.
	Shadow            bool
	ShadowGracePeriod time.Duration

	ShowVersion bool
}

// SecureServing is the secure endpoint's flags and server (pkg/server). The
// command gives it (main.go), so that this package and its tests do not
// build k8s.io/apiserver's serving stack.
type SecureServing interface {
	AddFlags(fs *pflag.FlagSet)
	Validate() []error
	// Serve serves h until ctx is cancelled, unless the flags turn the
	// endpoint off; stop cancels it and waits until it has stopped.
	// kubeconfig is --kubeconfig: where the reviews go unless the serving
	// flags say otherwise.
	Serve(ctx context.Context, kubeconfig string, h http.Handler) (stop func(), err error)
}

// NewOptions returns the defaults, as kube-controller-manager has them where
// it has the same setting, without a secure endpoint (NewCommand adds one).
func NewOptions() *Options {
	return &Options{
		QPS:   20,
		Burst: 30,
		Logs:  logsapi.NewLoggingConfiguration(),
		LeaderElection: componentbaseconfig.LeaderElectionConfiguration{
			LeaderElect:       true,
			LeaseDuration:     durationOf(15 * time.Second),
			RenewDeadline:     durationOf(10 * time.Second),
			RetryPeriod:       durationOf(2 * time.Second),
			ResourceLock:      "leases",
			ResourceName:      DefaultLeaseName,
			ResourceNamespace: "kube-system",
		},
		ReconcileSyncPeriod:    time.Minute,
		MaxWaitForUnmount:      6 * time.Minute,
		UnhealthyZoneThreshold: 0.55,
		UnhealthyZoneMinNodes:  3,
		Workers:                10,
		OtherWriterCheckPeriod: time.Minute,
		CSIMigration:           migration.PolicyPerNode,
		HandoffTimeout:         15 * time.Second,
		ShadowGracePeriod:      time.Minute,
	}
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file. Empty: the in-cluster configuration.")
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Queries per second to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries to the API server.")
	logsapi.AddFlags(o.Logs, fs)
	options.BindLeaderElectionFlags(&o.LeaderElection, fs)
	if o.Serving != nil {
		o.Serving.AddFlags(fs)
	}
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", o.HTTPEndpoint,
		"Address (host:port) serving /metrics, /healthz, /livez and /readyz in plain HTTP without authentication, for local use (never /explain nor /shadow). Empty: not served.")
	fs.DurationVar(&o.ReconcileSyncPeriod, "attach-detach-reconcile-sync-period", o.ReconcileSyncPeriod,
		"Period of the sync that compares attached volumes with their VolumeAttachments (at least 1s).")
	fs.BoolVar(&o.DisableReconcileSync, "disable-attach-detach-reconcile-sync", o.DisableReconcileSync, "Disable the periodic sync.")
	fs.BoolVar(&o.DisableForceDetachOnTimeout, "disable-force-detach-on-timeout", o.DisableForceDetachOnTimeout,
		"Never detach a volume still mounted on an unhealthy node because the max wait for unmount passed (the out-of-service taint still forces it).")
	fs.DurationVar(&o.MaxWaitForUnmount, "max-wait-for-unmount", o.MaxWaitForUnmount,
		"How long a volume still mounted on an unhealthy (not Ready or deleted) node is waited for before it is detached anyway.")
	fs.Var(&optionalDuration{d: &o.MaxWaitForUnmountDeletedNode}, "max-wait-for-unmount-deleted-node",
		"How long a volume still mounted on a node whose Node object was deleted is waited for before it is detached anyway (0: at once). "+
			"Default: the value of --max-wait-for-unmount. Lower it only where a deleted Node object means the machine is gone: "+
			"a volume of a live machine whose Node object someone deleted would be detached while in use.")
	fs.Float64Var(&o.UnhealthyZoneThreshold, "unhealthy-zone-threshold", o.UnhealthyZoneThreshold,
		"Share of a zone's managed nodes (by topology.kubernetes.io/zone; nodes without it form one zone) that must be not Ready, "+
			"or deleted within the max wait for unmount, for the zone to count as disrupted (0 < x <= 1): the forced detaches by "+
			"timeout of its nodes are then held, since so many nodes failing at once are more likely cut off (a partition) than dead. "+
			"The out-of-service taint still forces a detach at once.")
	fs.IntVar(&o.UnhealthyZoneMinNodes, "unhealthy-zone-min-nodes", o.UnhealthyZoneMinNodes,
		"Least number of a zone's managed nodes that must be not Ready (or deleted within the max wait) for it to count as disrupted (at least 1): "+
			"below it, a dead node is handled alone.")
	fs.BoolVar(&o.DisableZoneDisruptionGuard, "disable-zone-disruption-guard", o.DisableZoneDisruptionGuard,
		"Never hold forced detaches by timeout for a disrupted zone.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Number of volume/node pairs reconciled at once (1-1000). Node statuses are written by one writer per 40 of --kube-api-qps (1 to 10), one patch per node carrying all its changes.")
	fs.DurationVar(&o.OtherWriterCheckPeriod, "other-writer-check-period", o.OtherWriterCheckPeriod,
		"Period of the report (metric, log line) of another attach/detach controller (kube-controller-manager's) beside this one, seen from who writes VolumeAttachments, node.status.volumesAttached and attach events; its first finding is reported at once (at least 1s; 0 disables the watch, and the watch on events).")
	fs.StringVar(&o.CSIMigration, "csi-migration", o.CSIMigration,
		"Who decides whether an in-tree volume (awsElasticBlockStore, gcePersistentDisk, ...) is attached through its CSI driver: "+
			"\"per-node\": each node's CSINode, else its CSINodeInfo; a node that has said nothing yet makes the volume wait. "+
			"\"completed\": as kube-controller-manager v1.37, every plugin whose migration upstream declares complete (aws-ebs, gce-pd, azure-disk, azure-file, cinder, vsphere-volume, portworx-volume) uses CSI on every node without reading CSINode.")
	fs.DurationVar(&o.HandoffTimeout, "handoff-timeout", o.HandoffTimeout,
		"On SIGTERM, how long the controller (still holding its Lease) waits for the attaches and detaches under way to finish, "+
			"starting none, and lists in node status every volume attached, before it exits: the next controller "+
			"(a standby, or kube-controller-manager after a rollback) then finds no VolumeAttachment it could take for unattached. "+
			"0: exit at once; at most 10m. Keep it below the pod's terminationGracePeriodSeconds.")
	fs.BoolVar(&o.Shadow, "shadow", o.Shadow,
		"Shadow mode: run beside kube-controller-manager's attach/detach controller, decide as usual and write nothing "+
			"(no VolumeAttachment, node status or event; only the Lease of leader election); report where this controller "+
			"would act otherwise than the cluster shows (metrics, logs, /shadow, /explain).")
	fs.DurationVar(&o.ShadowGracePeriod, "shadow-grace-period", o.ShadowGracePeriod,
		"In shadow mode, how long a disagreement with the cluster must last before it is reported (at least 1s): "+
			"the other controller needs a few seconds to act.")
	fs.BoolVar(&o.ShowVersion, "version", false, "Print the version and exit.")
}

// Validate refuses values out of range, naming the flag.
func (o *Options) Validate(gate featuregate.FeatureGate) error {
	var errs []error
	if o.QPS <= 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps must be greater than 0, got %v", o.QPS))
	}
	if o.Burst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-burst must be at least 1, got %d", o.Burst))
	}
	if o.ReconcileSyncPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--attach-detach-reconcile-sync-period must be at least 1s, got %s", o.ReconcileSyncPeriod))
	}
	if o.MaxWaitForUnmount <= 0 {
		errs = append(errs, fmt.Errorf("--max-wait-for-unmount must be greater than 0, got %s", o.MaxWaitForUnmount))
	}
	if o.UnhealthyZoneThreshold <= 0 || o.UnhealthyZoneThreshold > 1 {
		errs = append(errs, fmt.Errorf("--unhealthy-zone-threshold must be greater than 0 and at most 1, got %v", o.UnhealthyZoneThreshold))
	}
	if o.UnhealthyZoneMinNodes < 1 {
		errs = append(errs, fmt.Errorf("--unhealthy-zone-min-nodes must be at least 1, got %d", o.UnhealthyZoneMinNodes))
	}
	if d := o.MaxWaitForUnmountDeletedNode; d != nil && *d < 0 {
		errs = append(errs, fmt.Errorf("--max-wait-for-unmount-deleted-node must not be negative, got %s", *d))
	}
	if o.OtherWriterCheckPeriod != 0 && o.OtherWriterCheckPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--other-writer-check-period must be 0 or at least 1s, got %s", o.OtherWriterCheckPeriod))
	}
	if o.HandoffTimeout < 0 || o.HandoffTimeout > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--handoff-timeout must be between 0 and 10m, got %s", o.HandoffTimeout))
	}
	if o.ShadowGracePeriod < time.Second {
		errs = append(errs, fmt.Errorf("--shadow-grace-period must be at least 1s, got %s", o.ShadowGracePeriod))
	}
	if o.Shadow && o.LeaderElection.LeaderElect && o.LeaderElection.ResourceName == DefaultLeaseName {
		errs = append(errs, fmt.Errorf("--shadow with --leader-elect needs a Lease of its own, not the controller's %q: "+
			"set --leader-elect-resource-name (for example %s-shadow), or the shadow would keep the controller from leading at the cut-over",
			DefaultLeaseName, DefaultLeaseName))
	}
	if _, err := migration.CompletedMigrations(o.CSIMigration); err != nil {
		errs = append(errs, fmt.Errorf("--csi-migration must be one of %s, got %q", strings.Join(migration.Policies(), ", "), o.CSIMigration))
	}
	if o.Workers < 1 || o.Workers > 1000 {
		errs = append(errs, fmt.Errorf("--workers must be between 1 and 1000, got %d", o.Workers))
	}
	if le := o.LeaderElection; le.LeaderElect {
		if le.LeaseDuration.Duration <= le.RenewDeadline.Duration {
			errs = append(errs, fmt.Errorf("--leader-elect-lease-duration (%s) must be greater than --leader-elect-renew-deadline (%s)",
				le.LeaseDuration.Duration, le.RenewDeadline.Duration))
		}
		if le.RetryPeriod.Duration <= 0 || le.RenewDeadline.Duration <= le.RetryPeriod.Duration {
			errs = append(errs, fmt.Errorf("--leader-elect-renew-deadline (%s) must be greater than --leader-elect-retry-period (%s), which must be positive",
				le.RenewDeadline.Duration, le.RetryPeriod.Duration))
		}
		if le.ResourceLock != "leases" {
			errs = append(errs, fmt.Errorf("--leader-elect-resource-lock must be \"leases\", got %q", le.ResourceLock))
		}
		if le.ResourceName == "" || le.ResourceNamespace == "" {
			errs = append(errs, errors.New("--leader-elect-resource-name and --leader-elect-resource-namespace must not be empty"))
		}
	}
	if o.Serving != nil {
		errs = append(errs, o.Serving.Validate()...)
	}
	if err := logsapi.Validate(o.Logs, gate, nil).ToAggregate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// optionalDuration is a duration flag whose default is "not set" (nil), so
// that its default can follow another flag.
type optionalDuration struct{ d **time.Duration }

var _ pflag.Value = (*optionalDuration)(nil)

func (o *optionalDuration) String() string {
	if o.d == nil || *o.d == nil {
		return ""
	}
	return (*o.d).String()
}

func (o *optionalDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*o.d = &d
	return nil
}

func (o *optionalDuration) Type() string { return "duration" }

// zoneThreshold is the reconciler's threshold: 0 turns the guard off.
func (o *Options) zoneThreshold() float64 {
	if o.DisableZoneDisruptionGuard {
		return 0
	}
	return o.UnhealthyZoneThreshold
}
