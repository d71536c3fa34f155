package sim

// The scheduler runs one task at a time. A task is one queue item processed
// by the controller, in a goroutine of its own; it stops at every API call
// (world.react calls yield), and the scheduler then chooses, from the seed,
// what happens next: another task runs, an event is delivered, the attacher
// acts, time passes... Only one goroutine runs at any moment and every
// choice comes from the seeded source, so a seed replays exactly.

type task struct {
	id     int
	desc   string
	gen    int // the controller generation that runs it
	resume chan bool
	killed bool
}

type taskReport struct {
	t    *task
	done bool
}

// start runs fn as a new task until it yields or ends.
func (s *Sim) start(desc string, fn func()) {
	s.taskSeq++
	t := &task{id: s.taskSeq, desc: desc, gen: s.gen, resume: make(chan bool)}
	go func() {
		<-t.resume
		fn()
		s.reports <- taskReport{t: t, done: true}
	}()
	s.run(t, true)
}

// run lets t go on until its next yield or its end.
func (s *Sim) run(t *task, alive bool) {
	s.current = t
	t.resume <- alive
	r := <-s.reports
	s.current = nil
	if r.t != t {
		panic("a task ran that was not resumed")
	}
	if !r.done {
		s.paused = append(s.paused, t)
	}
}

// resumeAt lets the i-th paused task go on.
func (s *Sim) resumeAt(i int) {
	t := s.paused[i]
	s.paused = append(s.paused[:i], s.paused[i+1:]...)
	s.stats["interleaving: task resumed after others ran"]++
	s.tracef("resume task %d (%s)", t.id, t.desc)
	s.run(t, !t.killed)
}

// yield is called by a task at an API call: the scheduler decides what runs
// next. It returns true when the task's controller was killed meanwhile:
// the call gets no answer.
func (s *Sim) yield() bool {
	t := s.current
	if t == nil {
		return false
	}
	s.reports <- taskReport{t: t}
	alive := <-t.resume
	if !alive {
		t.killed = true
	}
	return t.killed
}

// drainKilled runs the tasks of a killed controller to their end: their API
// calls fail, and they change nothing but the dead controller's memory.
func (s *Sim) drainKilled() {
	for len(s.paused) > 0 {
		t := s.paused[0]
		s.paused = s.paused[1:]
		t.killed = true
		s.run(t, false)
	}
}
