package cache

// A graceful stop hands the volumes over to whichever controller runs next
// (pkg/nodestatus/handoff.go says why and how). The actual state keeps one
// flag of it: from HandOver on, no detach of an attached volume starts
// (StartDetach refuses) and the reports list again the attached volumes
// that were withdrawn for a detach that has not started.

// HandOver records that a handoff began.
func (a *ActualState) HandOver() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handingOver = true
}

// HandingOver reports whether a handoff began (HandOver).
func (a *ActualState) HandingOver() bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.handingOver
}
