package shadow

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// Report sizes: the oldest open and the last closed disagreements the
// summary lists.
const (
	summaryOldest = 50
	summaryClosed = 50
)

// Disagreement is one difference between what we would do and what the
// cluster shows, on one volume and node.
type Disagreement struct {
	Kind    Kind     `json:"kind"`
	Volume  string   `json:"volume"`
	Node    string   `json:"node"`
	Pods    []string `json:"pods,omitempty"`
	Ours    string   `json:"ours"`
	Cluster string   `json:"cluster"`
	// Since is when it was first seen; it is reported once it has lasted
	// the grace period.
	Since time.Time `json:"since"`
	// Ended is when it was last seen, for a closed one.
	Ended *time.Time `json:"ended,omitempty"`
}

// Tracker holds the disagreements: pending (shorter than the grace period)
// and open (reported).
type Tracker struct {
	grace   time.Duration
	started time.Time
	open    *prometheus.GaugeVec
	opened  *prometheus.CounterVec

	mu      sync.Mutex
	entries map[cache.Key]*entry
	closed  []Disagreement // the last summaryClosed, oldest first
	total   map[Kind]int
}

type entry struct {
	Disagreement
	reported bool
}

// NewTracker returns a Tracker reporting disagreements that last grace, with
// its metrics registered into reg (when not nil).
func NewTracker(grace time.Duration, now time.Time, reg prometheus.Registerer) (*Tracker, error) {
	t := &Tracker{
		grace:   grace,
		started: now,
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "attachdetach_controller_shadow_disagreements",
			Help: "Shadow mode: open disagreements between what this controller would do and what the cluster shows, by kind (would-attach, would-detach, would-not-attach, would-wait-for-unmount).",
		}, []string{"kind"}),
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "attachdetach_controller_shadow_disagreements_total",
			Help: "Shadow mode: disagreements opened (lasted the grace period), by kind.",
		}, []string{"kind"}),
		entries: map[cache.Key]*entry{},
		total:   map[Kind]int{},
	}
	for _, k := range Kinds() {
		t.open.WithLabelValues(string(k)).Set(0)
		t.opened.WithLabelValues(string(k))
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{t.open, t.opened} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register shadow metrics: %w", err)
			}
		}
	}
	return t, nil
}

// GracePeriod is how long a disagreement lasts before it is reported.
func (t *Tracker) GracePeriod() time.Duration { return t.grace }

// Held returns the kind of the disagreement pending or open on k, and since
// when; "" when there is none.
func (t *Tracker) Held(k cache.Key) (Kind, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[k]; e != nil {
		return e.Kind, e.Since
	}
	return "", time.Time{}
}

// Get returns the disagreement pending or open on k, and whether it is
// reported (open).
func (t *Tracker) Get(k cache.Key) (Disagreement, bool, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		return Disagreement{}, false, false
	}
	return e.copy(), e.reported, true
}

// Record takes the verdict of k's sync at now. A disagreement is opened once
// it has lasted the grace period, closed on the first sync that agrees, and
// restarted when its kind changes. It returns when k must be synced again
// for a pending disagreement to be opened (zero: no need).
func (t *Tracker) Record(ctx context.Context, k cache.Key, v Verdict, pods []string, now time.Time) time.Duration {
	logger := klog.FromContext(ctx)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e != nil && e.Kind != v.Kind {
		t.closeLocked(logger, k, e, now)
		e = nil
	}
	if v.Agree() {
		return 0
	}
	if e == nil {
		e = &entry{Disagreement: Disagreement{Kind: v.Kind, Volume: string(k.Volume), Node: k.Node, Since: now}}
		t.entries[k] = e
	}
	e.Ours, e.Cluster = v.Ours, v.Cluster
	if len(pods) > 0 || e.Kind != WouldWaitForUnmount {
		e.Pods = pods
	}
	if e.reported {
		return 0
	}
	if left := t.grace - now.Sub(e.Since); left > 0 {
		return left
	}
	e.reported = true
	t.open.WithLabelValues(string(e.Kind)).Inc()
	t.opened.WithLabelValues(string(e.Kind)).Inc()
	t.total[e.Kind]++
	logger.Info("Shadow disagreement", "kind", e.Kind, "volume", k.Volume, "node", k.Node, "pods", e.Pods,
		"ours", e.Ours, "cluster", e.Cluster, "since", e.Since.UTC().Format(time.RFC3339))
	return 0
}

func (t *Tracker) closeLocked(logger klog.Logger, k cache.Key, e *entry, now time.Time) {
	delete(t.entries, k)
	if !e.reported {
		return
	}
	t.open.WithLabelValues(string(e.Kind)).Dec()
	d := e.copy()
	d.Ended = &now
	t.closed = append(t.closed, d)
	if len(t.closed) > summaryClosed {
		t.closed = slices.Delete(t.closed, 0, len(t.closed)-summaryClosed)
	}
	logger.Info("Shadow disagreement ended", "kind", e.Kind, "volume", k.Volume, "node", k.Node, "pods", e.Pods,
		"lasted", now.Sub(e.Since).Round(time.Second).String())
}

func (e *entry) copy() Disagreement {
	d := e.Disagreement
	d.Pods = slices.Clone(d.Pods)
	return d
}

// Summary is the report an operator reads after a day in shadow mode.
type Summary struct {
	// Since is when this leader started comparing.
	Since       time.Time `json:"since"`
	GracePeriod string    `json:"gracePeriod"`
	// Open counts the open disagreements by kind; Opened those opened since
	// Since, closed or not.
	Open   map[Kind]int `json:"open"`
	Opened map[Kind]int `json:"opened"`
	// Pending counts the disagreements younger than the grace period.
	Pending int `json:"pending"`
	// Oldest lists the oldest open disagreements, oldest first.
	Oldest []Disagreement `json:"oldestOpen"`
	// Closed lists the last closed ones, last closed first.
	Closed []Disagreement `json:"recentlyClosed"`
}

// Summary returns the report.
func (t *Tracker) Summary() Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Summary{Since: t.started, GracePeriod: t.grace.String(), Open: map[Kind]int{}, Opened: map[Kind]int{}}
	for _, k := range Kinds() {
		s.Open[k] = 0
		s.Opened[k] = t.total[k]
	}
	for _, e := range t.entries {
		if !e.reported {
			s.Pending++
			continue
		}
		s.Open[e.Kind]++
		s.Oldest = append(s.Oldest, e.copy())
	}
	slices.SortFunc(s.Oldest, func(a, b Disagreement) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.Volume+"\x00"+a.Node, b.Volume+"\x00"+b.Node)
	})
	if len(s.Oldest) > summaryOldest {
		s.Oldest = s.Oldest[:summaryOldest]
	}
	for i := len(t.closed) - 1; i >= 0; i-- {
		s.Closed = append(s.Closed, t.closed[i])
	}
	return s
}
