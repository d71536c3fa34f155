package reconciler

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

func TestContinuesOperation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	with := func(a cache.Attachment) (cache.Attachment, bool) { return a, true }
	for _, tc := range []struct {
		name   string
		action Action
		a      cache.Attachment
		has    bool
		want   bool
	}{
		{"nothing to do", Nothing, cache.Attachment{}, false, true},
		{"new attach", Attach, cache.Attachment{}, false, false},
		{"attach started before", Attach, cache.Attachment{State: cache.Uncertain}, true, true},
		{"withdraw of an attached volume", Withdraw, cache.Attachment{State: cache.Attached}, true, false},
		{"withdraw of an attach never confirmed", Withdraw, cache.Attachment{State: cache.Uncertain}, true, true},
		{"detach of an attached volume", Detach, cache.Attachment{State: cache.Attached, Withdrawn: true}, true, false},
		{"detach that began and failed", Detach, cache.Attachment{State: cache.Attached, Withdrawn: true, DetachStarted: t0}, true, true},
		{"detach under way", Detach, cache.Attachment{State: cache.Detaching, DetachStarted: t0}, true, true},
		{"detach of an attach never confirmed", Detach, cache.Attachment{State: cache.Uncertain}, true, true},
		{"wait for unmount", Wait, cache.Attachment{State: cache.Attached}, true, false},
		{"wait before the detach of an attach never confirmed", Wait, cache.Attachment{State: cache.Uncertain}, true, true},
		{"blocked", Blocked, cache.Attachment{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decision{Action: tc.action}
			if tc.has {
				d.Attachment, d.HasAttachment = with(tc.a)
			}
			if got := continuesOperation(d); got != tc.want {
				t.Errorf("continuesOperation(%s of %+v) = %v, want %v", tc.action, tc.a, got, tc.want)
			}
		})
	}
}
