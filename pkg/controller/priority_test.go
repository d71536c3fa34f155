package controller

import (
	"slices"
	"testing"

	"k8s.io/client-go/util/workqueue"
)

// Urgent items go first, in order; an item added again once urgent moves
// ahead; an item is handed out once, however often it moved.
func TestPriorityQueue(t *testing.T) {
	urgent := map[string]bool{"attach-1": true, "attach-2": true}
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{
		Queue: newPriorityQueue(func(s string) bool { return urgent[s] }),
	})
	for _, s := range []string{"detach-1", "attach-1", "detach-2", "detach-3", "attach-2"} {
		q.Add(s)
	}
	urgent["detach-3"] = true
	q.Add("detach-3")
	var got []string
	for q.Len() > 0 {
		item, _ := q.Get()
		got = append(got, item)
		q.Done(item)
	}
	if want := []string{"attach-1", "attach-2", "detach-3", "detach-1", "detach-2"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	q.ShutDown()
	if _, quit := q.Get(); !quit {
		t.Error("a shut down queue handed out an item")
	}
}
