package bench

import "time"

// Floors are the least time each phase can take within the API budget: a
// client with a token bucket of QPS per second and Burst tokens (full at
// the start of a phase) sends W requests in (W - Burst) / QPS seconds.
//
// W counts only the writes no controller can avoid (reads come from
// informers; events are left out, see the report):
//
//   - burst, VolumeAttachments exist: one create per volume: V.
//   - burst, in node status: V creates plus at least one status patch per
//     node: V + N.
//   - churn round: v volumes move to another node: v deletes and v creates,
//     and at least one status patch per node that loses or gains a volume:
//     2v + n. A controller that writes every change promptly needs two per
//     node (the old volume leaves the status before its detach, the new one
//     enters it once attached, after the previous node's detach); only by
//     holding a withdrawal back until the incoming volume is attached can
//     both go in one patch.
//   - teardown: V deletes plus one status patch per node (the volumes leave
//     node.status before the detach): V + N.
type Floors struct {
	QPS   float64
	Burst int
}

// Writes returns the floor of w writes.
func (f Floors) Writes(w int) time.Duration {
	return time.Duration(float64(max(0, w-f.Burst)) / f.QPS * float64(time.Second))
}

// BurstCreates is the floor of "every VolumeAttachment exists".
func (f Floors) BurstCreates(volumes int) time.Duration { return f.Writes(volumes) }

// BurstStatus is the floor of "every volume in node.status".
func (f Floors) BurstStatus(volumes, nodes int) time.Duration { return f.Writes(volumes + nodes) }

// ChurnRound is the floor of one churn round moving v volumes across n nodes.
func (f Floors) ChurnRound(v, n int) time.Duration { return f.Writes(2*v + n) }

// ChurnRoundPrompt is the floor of one churn round for a controller that
// writes every change promptly: 2v + 2n (the floor of the 2026-11-21
// reports).
func (f Floors) ChurnRoundPrompt(v, n int) time.Duration { return f.Writes(2*v + 2*n) }

// Teardown is the floor of "every VolumeAttachment gone".
func (f Floors) Teardown(volumes, nodes int) time.Duration { return f.Writes(volumes + nodes) }
