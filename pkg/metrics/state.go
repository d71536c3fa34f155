package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	totalVolumesDesc = prometheus.NewDesc("attachdetach_controller_total_volumes",
		"Number of volumes in A/D Controller", []string{"plugin_name", "state"}, nil)
	waitingDesc = prometheus.NewDesc("attachdetach_controller_volumes_waiting_for_node_info",
		"Desired volumes whose attach mechanism can't be decided until their node reports its CSINode or CSINodeInfo", nil, nil)
	attachmentsDesc = prometheus.NewDesc("attachdetach_controller_attachments",
		"Attachments known to the controller, by state: attached, uncertain (attach started, not confirmed), detaching", []string{"state"}, nil)
	pendingAttachDesc = prometheus.NewDesc("attachdetach_controller_oldest_pending_attach_seconds",
		"Age of the oldest attach started by the controller and not confirmed yet; 0 when none is pending", nil, nil)
)

// State is what the collector reads from the caches at scrape time.
type State struct {
	// Desired counts desired volumes by plugin, and those waiting for node
	// information.
	Desired func() (byPlugin map[string]int, pending int)
	// Actual counts attachments by plugin.
	Actual func() map[string]int
	// Attachments counts attachments by state and gives the start of the
	// oldest unconfirmed attach (zero: none).
	Attachments func() (byState map[string]int, oldestPendingAttach time.Time)
}

// StateCollector reports the sizes of the desired and actual states at
// scrape time, from the caches alone (no API call).
type StateCollector struct {
	state State
	now   func() time.Time
}

var _ prometheus.Collector = (*StateCollector)(nil)

// NewStateCollector returns a collector over the caches.
func NewStateCollector(s State) *StateCollector {
	return &StateCollector{state: s, now: time.Now}
}

func (s *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- totalVolumesDesc
	ch <- waitingDesc
	ch <- attachmentsDesc
	ch <- pendingAttachDesc
}

func (s *StateCollector) Collect(ch chan<- prometheus.Metric) {
	byPlugin, pending := s.state.Desired()
	for plugin, n := range byPlugin {
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue, float64(n), plugin, "desired_state_of_world")
	}
	for plugin, n := range s.state.Actual() {
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue, float64(n), plugin, "actual_state_of_world")
	}
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(pending))
	byState, oldest := s.state.Attachments()
	for state, n := range byState {
		ch <- prometheus.MustNewConstMetric(attachmentsDesc, prometheus.GaugeValue, float64(n), state)
	}
	age := 0.0
	if !oldest.IsZero() {
		age = s.now().Sub(oldest).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(pendingAttachDesc, prometheus.GaugeValue, age)
}
