package controller

import (
	"slices"
	"testing"

	"k8s.io/client-go/util/workqueue"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
)

// Items go by rank, each rank in order; an item added again once its rank
// rose moves ahead (never back); an item is handed out once, however often
// it moved.
func TestPriorityQueue(t *testing.T) {
	rank := map[string]int{"attach-1": budget.Attach, "attach-2": budget.Attach, "move-1": budget.Move,
		"detach-1": budget.Other, "detach-2": budget.Other, "detach-3": budget.Other, "odd": 7}
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{
		Queue: newPriorityQueue(func(s string) int { return rank[s] }),
	})
	for _, s := range []string{"detach-1", "attach-1", "detach-2", "detach-3", "attach-2", "odd", "move-1"} {
		q.Add(s)
	}
	rank["detach-3"] = budget.Move
	q.Add("detach-3")
	rank["attach-1"] = budget.Other
	q.Add("attach-1")
	var got []string
	for q.Len() > 0 {
		item, _ := q.Get()
		got = append(got, item)
		q.Done(item)
	}
	if want := []string{"move-1", "detach-3", "attach-1", "attach-2", "detach-1", "detach-2", "odd"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	q.ShutDown()
	if _, quit := q.Get(); !quit {
		t.Error("a shut down queue handed out an item")
	}
}
