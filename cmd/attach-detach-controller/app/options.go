// Package app wires the attach-detach-controller binary: flags, clients,
// leader election, the HTTP endpoint and the controller.
package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	componentbaseconfig "k8s.io/component-base/config"
	"k8s.io/component-base/config/options"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/server"
)

// Options are the command line settings.
type Options struct {
	Kubeconfig string
	QPS        float32
	Burst      int

	Logs           *logsapi.LoggingConfiguration
	LeaderElection componentbaseconfig.LeaderElectionConfiguration
	HTTPEndpoint   string
	// Serving is the secure endpoint: HTTPS, delegated authentication and
	// authorization.
	Serving *server.Options

	ReconcileSyncPeriod         time.Duration
	DisableReconcileSync        bool
	DisableForceDetachOnTimeout bool
	MaxWaitForUnmount           time.Duration
	Workers                     int
	OtherWriterCheckPeriod      time.Duration

	ShowVersion bool
}

// NewOptions returns the defaults, as kube-controller-manager has them where
// it has the same setting.
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
			ResourceName:      "attach-detach-controller",
			ResourceNamespace: "kube-system",
		},
		Serving:                server.NewOptions(),
		ReconcileSyncPeriod:    time.Minute,
		MaxWaitForUnmount:      6 * time.Minute,
		Workers:                10,
		OtherWriterCheckPeriod: time.Minute,
	}
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file. Empty: the in-cluster configuration.")
	fs.Float32Var(&o.QPS, "kube-api-qps", o.QPS, "Queries per second to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of queries to the API server.")
	logsapi.AddFlags(o.Logs, fs)
	options.BindLeaderElectionFlags(&o.LeaderElection, fs)
	o.Serving.AddFlags(fs)
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", o.HTTPEndpoint,
		"Address (host:port) serving /metrics, /healthz, /livez and /readyz in plain HTTP without authentication, for local use (never /explain). Empty: not served.")
	fs.DurationVar(&o.ReconcileSyncPeriod, "attach-detach-reconcile-sync-period", o.ReconcileSyncPeriod,
		"Period of the sync that compares attached volumes with their VolumeAttachments (at least 1s).")
	fs.BoolVar(&o.DisableReconcileSync, "disable-attach-detach-reconcile-sync", o.DisableReconcileSync, "Disable the periodic sync.")
	fs.BoolVar(&o.DisableForceDetachOnTimeout, "disable-force-detach-on-timeout", o.DisableForceDetachOnTimeout,
		"Never detach a volume still mounted on an unhealthy node because the max wait for unmount passed (the out-of-service taint still forces it).")
	fs.DurationVar(&o.MaxWaitForUnmount, "max-wait-for-unmount", o.MaxWaitForUnmount,
		"How long a volume still mounted on an unhealthy (not Ready or deleted) node is waited for before it is detached anyway.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Number of volume/node pairs reconciled at once (1-1000). Node statuses are written by one writer, one patch per node carrying all its changes.")
	fs.DurationVar(&o.OtherWriterCheckPeriod, "other-writer-check-period", o.OtherWriterCheckPeriod,
		"Period of the report (metric, log line) of another attach/detach controller (kube-controller-manager's) writing VolumeAttachments or node.status.volumesAttached beside this one, as the informers see its writes (at least 1s; 0 disables the watch).")
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
	if o.OtherWriterCheckPeriod != 0 && o.OtherWriterCheckPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--other-writer-check-period must be 0 or at least 1s, got %s", o.OtherWriterCheckPeriod))
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
	errs = append(errs, o.Serving.Validate()...)
	if err := logsapi.Validate(o.Logs, gate, nil).ToAggregate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
