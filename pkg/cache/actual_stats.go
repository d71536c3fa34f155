package cache

import "time"

// StateStats counts attachments by state and finds the oldest attach still
// unconfirmed: what an operator alerts on when an attacher stops acting.
func (a *ActualState) StateStats() (byState map[State]int, oldestPendingAttach time.Time) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	byState = map[State]int{Attached: 0, Uncertain: 0, Detaching: 0}
	for _, byNode := range a.volumes {
		for _, at := range byNode {
			byState[at.State]++
			if at.State == Uncertain && !at.AttachStarted.IsZero() &&
				(oldestPendingAttach.IsZero() || at.AttachStarted.Before(oldestPendingAttach)) {
				oldestPendingAttach = at.AttachStarted
			}
		}
	}
	return byState, oldestPendingAttach
}
