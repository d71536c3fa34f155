package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/leaderelection"
)

// LeaderMetrics serve leader_election_master_status, as
// kube-controller-manager does: 1 on the replica that holds the lease.
type LeaderMetrics struct {
	status   *prometheus.GaugeVec
	slowpath *prometheus.CounterVec
}

// NewLeaderMetrics registers the leader election metrics into reg.
func NewLeaderMetrics(reg prometheus.Registerer) (*LeaderMetrics, error) {
	m := &LeaderMetrics{
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "leader_election_master_status",
			Help: "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease."},
			[]string{"name"}),
		slowpath: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leader_election_slowpath_total",
			Help: "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease."},
			[]string{"name"}),
	}
	for _, c := range []prometheus.Collector{m.status, m.slowpath} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Standby reports the lease name as not held (0) until this replica leads.
func (m *LeaderMetrics) Standby(name string) {
	m.status.WithLabelValues(name).Set(0)
	m.slowpath.WithLabelValues(name)
}

// Install hands the metrics to client-go's leader election, which keeps
// them process-wide and takes only the first provider it is given.
func (m *LeaderMetrics) Install() { leaderelection.SetProvider(m) }

// NewLeaderMetric implements leaderelection.MetricsProvider.
func (m *LeaderMetrics) NewLeaderMetric() leaderelection.LeaderMetric { return leaderMetric{m} }

type leaderMetric struct{ m *LeaderMetrics }

func (l leaderMetric) On(name string)                { l.m.status.WithLabelValues(name).Set(1) }
func (l leaderMetric) Off(name string)               { l.m.status.WithLabelValues(name).Set(0) }
func (l leaderMetric) SlowpathExercised(name string) { l.m.slowpath.WithLabelValues(name).Inc() }
