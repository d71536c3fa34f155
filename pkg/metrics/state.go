package metrics

import "github.com/prometheus/client_golang/prometheus"

var (
	totalVolumesDesc = prometheus.NewDesc("attachdetach_controller_total_volumes",
		"Number of volumes in A/D Controller", []string{"plugin_name", "state"}, nil)
	waitingDesc = prometheus.NewDesc("attachdetach_controller_volumes_waiting_for_node_info",
		"Desired volumes whose attach mechanism can't be decided until their node reports its CSINode or CSINodeInfo", nil, nil)
)

// StateCollector reports the sizes of the desired and actual states at
// scrape time, from the caches alone (no API call).
type StateCollector struct {
	desired func() (map[string]int, int)
	actual  func() map[string]int
}

var _ prometheus.Collector = (*StateCollector)(nil)

// NewStateCollector returns a collector over the two states' Stats methods.
func NewStateCollector(desired func() (byPlugin map[string]int, pending int), actual func() map[string]int) *StateCollector {
	return &StateCollector{desired: desired, actual: actual}
}

func (s *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- totalVolumesDesc
	ch <- waitingDesc
}

func (s *StateCollector) Collect(ch chan<- prometheus.Metric) {
	byPlugin, pending := s.desired()
	for plugin, n := range byPlugin {
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue, float64(n), plugin, "desired_state_of_world")
	}
	for plugin, n := range s.actual() {
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue, float64(n), plugin, "actual_state_of_world")
	}
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(pending))
}
