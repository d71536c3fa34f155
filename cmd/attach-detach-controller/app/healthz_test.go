package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kube-attach/attach-detach-controller/pkg/controller"
)

// hangingLock grants the lease once, then every renewal hangs: a leader
// whose renew loop is stuck (an API call that never returns) still believes
// it leads, and only the watchdog can tell.
type hangingLock struct {
	mu     sync.Mutex
	record *resourcelock.LeaderElectionRecord
	raw    []byte
	hang   chan struct{}
}

func (l *hangingLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.record == nil {
		return nil, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "leases"}, "test")
	}
	r := *l.record
	return &r, l.raw, nil
}

func (l *hangingLock) Create(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.record, l.raw = &r, []byte(r.HolderIdentity+r.RenewTime.String())
	return nil
}

func (l *hangingLock) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	<-l.hang
	return context.Canceled
}

func (l *hangingLock) RecordEvent(string)                      {}
func (l *hangingLock) Identity() string                        { return "me" }
func (l *hangingLock) Describe() string                        { return "test/lease" }
func (l *hangingLock) ensureInterface() resourcelock.Interface { return l }

// TestHealthzFailsWhenLeaseRenewalsHang: /healthz, the liveness probe's
// path, answers 200 while the lease is fresh and 500 once the leader has not
// renewed it for the lease duration plus the tolerance, so that the kubelet
// restarts a leader whose elector is stuck.
func TestHealthzFailsWhenLeaseRenewalsHang(t *testing.T) {
	lock := &hangingLock{hang: make(chan struct{})}
	defer close(lock.hang)
	watchdog := leaderelection.NewLeaderHealthzAdaptor(200 * time.Millisecond)
	le, err := newElector(watchdog, leaderelection.LeaderElectionConfig{
		Lock:          lock.ensureInterface(),
		LeaseDuration: time.Second,
		RenewDeadline: 800 * time.Millisecond,
		RetryPeriod:   100 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go le.Run(ctx)

	var ready atomic.Bool
	var current atomic.Pointer[controller.Controller]
	e := newEndpoints(prometheus.NewRegistry(), watchdog, &ready, true, &current)
	code := func() int {
		rec := httptest.NewRecorder()
		e.healthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}

	deadline := time.Now().Add(10 * time.Second)
	for !le.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the elector never took the lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := code(); got != http.StatusOK {
		t.Fatalf("/healthz of a leader with a fresh lease: %d, want 200", got)
	}
	for code() != http.StatusInternalServerError {
		if time.Now().After(deadline) {
			t.Fatal("/healthz still answers 200 long after the lease went unrenewed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
