package cache

import "time"

// StateStats counts attachments by state and finds the oldest attach still
// unconfirmed: what an operator alerts on when an attacher stops acting.
func (a *ActualState) StateStats() (byState map[State]int, oldestPendingAttach time.Time) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	byState = map[State]int{Attached: 0, Uncertain: 0, Detaching: 0}
	for st, n := range a.byState {
		byState[st] = n
	}
	for _, at := range a.unconfirmed {
		if oldestPendingAttach.IsZero() || at.AttachStarted.Before(oldestPendingAttach) {
			oldestPendingAttach = at.AttachStarted
		}
	}
	return byState, oldestPendingAttach
}

// countLocked adds at, as it is now, to the counts; uncountLocked takes out
// what countLocked added for at as it was.
func (a *ActualState) countLocked(at *Attachment) {
	a.byState[at.State]++
	if at.State == Uncertain && !at.AttachStarted.IsZero() {
		a.unconfirmed[at.Key] = at
	}
}

func (a *ActualState) uncountLocked(at *Attachment) {
	if a.byState[at.State]--; a.byState[at.State] <= 0 {
		delete(a.byState, at.State)
	}
	delete(a.unconfirmed, at.Key)
}
