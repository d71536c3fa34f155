// Package metrics defines the controller's Prometheus metrics. Names and
// labels that kube-controller-manager serves are kept as they are, so that
// existing dashboards and alerts keep working. Every metric is registered into
// a registry the caller passes in; nothing here is global.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Operation names and statuses, as upstream labels them.
const (
	OperationAttach = "volume_attach"
	OperationDetach = "volume_detach"

	StatusSuccess     = "success"
	StatusFailUnknown = "fail-unknown"
)

// StabilityBeta is the stability level of a metric kube-controller-manager
// serves as BETA (component-base/metrics): dashboards and alerts may rely on
// its name, labels and buckets.
const StabilityBeta = "BETA"

// Metrics are the controller's own metrics.
type Metrics struct {
	// OperationDuration is storage_operation_duration_seconds.
	OperationDuration *prometheus.HistogramVec
	// ForcedDetaches counts detaches of volumes still mounted.
	ForcedDetaches *prometheus.CounterVec
	// MechanismDecisions counts the per-node mechanism decisions for in-tree
	// volumes, by plugin and mechanism ("csi", "in-tree", "pending").
	MechanismDecisions *prometheus.CounterVec
	// AttachErrors counts failed attach attempts by plugin.
	AttachErrors *prometheus.CounterVec
	// DisruptedZones is the number of zones whose forced detaches by
	// timeout are held, ForcedDetachesHeld the number of volumes whose
	// forced detach is due and held.
	DisruptedZones     prometheus.Gauge
	ForcedDetachesHeld prometheus.Gauge
}

// New returns the controller's metrics, unregistered.
func New() *Metrics {
	return &Metrics{
		OperationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "storage_operation_duration_seconds",
			// BETA since Kubernetes v1.37: its name, labels and buckets
			// change only through a deprecation. The help text begins with
			// the level, as component-base writes it for
			// kube-controller-manager.
			Help:    "[" + StabilityBeta + "] Storage operation duration",
			Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
		}, []string{"volume_plugin", "operation_name", "status", "migrated"}),
		ForcedDetaches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "attach_detach_controller",
			Name:      "attachdetach_controller_forced_detaches",
			Help:      "Number of times the A/D Controller performed a forced detach",
		}, []string{"reason"}),
		MechanismDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "attachdetach_controller_mechanism_decisions_total",
			Help: "Per-node decisions of which mechanism attaches an in-tree volume, by in-tree plugin and mechanism (csi, in-tree, pending)",
		}, []string{"plugin_name", "mechanism"}),
		AttachErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "attachdetach_controller_attach_errors_total",
			Help: "Failed attach attempts, by plugin",
		}, []string{"plugin_name"}),
		DisruptedZones: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "attachdetach_controller_disrupted_zones",
			Help: "Zones in which so many managed nodes are not ready that forced detaches by timeout are held",
		}),
		ForcedDetachesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "attachdetach_controller_forced_detaches_held",
			Help: "Volumes whose forced detach by timeout is due and held because their node's zone is disrupted",
		}),
	}
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.OperationDuration, m.ForcedDetaches, m.MechanismDecisions, m.AttachErrors,
		m.DisruptedZones, m.ForcedDetachesHeld} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ObserveOperation records one attach or detach.
func (m *Metrics) ObserveOperation(plugin, operation string, migrated, ok bool, d time.Duration) {
	status := StatusSuccess
	if !ok {
		status = StatusFailUnknown
	}
	mig := "false"
	if migrated {
		mig = "true"
	}
	m.OperationDuration.WithLabelValues(plugin, operation, status, mig).Observe(d.Seconds())
}
