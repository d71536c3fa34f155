package controller

import (
	"k8s.io/client-go/util/workqueue"
)

// priorityQueue is the storage of a work queue that hands out first the
// items urgent says are urgent when they are added (or added again): a new
// pod's attach, and its node's status write, do not wait behind a teardown
// of every other volume. Items of one rank go first in, first out. A
// detach waits while attaches keep coming; each attach is one quick sync.
type priorityQueue[T comparable] struct {
	urgent func(T) bool
	// lists[0] holds the urgent items, lists[1] the others; rank says
	// which list an item is in, and an entry of the other list is stale.
	lists [2][]T
	rank  map[T]int
}

var _ workqueue.Queue[string] = (*priorityQueue[string])(nil)

func newPriorityQueue[T comparable](urgent func(T) bool) *priorityQueue[T] {
	return &priorityQueue[T]{urgent: urgent, rank: map[T]int{}}
}

func (q *priorityQueue[T]) Push(item T) {
	r := 1
	if q.urgent(item) {
		r = 0
	}
	q.lists[r] = append(q.lists[r], item)
	q.rank[item] = r
}

// Touch moves an item added again ahead, when it has become urgent.
func (q *priorityQueue[T]) Touch(item T) {
	if r, ok := q.rank[item]; ok && r == 1 && q.urgent(item) {
		q.lists[0] = append(q.lists[0], item)
		q.rank[item] = 0
	}
}

func (q *priorityQueue[T]) Len() int { return len(q.rank) }

// Pop is called only when Len is not 0.
func (q *priorityQueue[T]) Pop() T {
	var zero T
	for r := range q.lists {
		for len(q.lists[r]) > 0 {
			item := q.lists[r][0]
			q.lists[r][0] = zero
			q.lists[r] = q.lists[r][1:]
			if cur, ok := q.rank[item]; ok && cur == r {
				delete(q.rank, item)
				return item
			}
		}
	}
	return zero
}

// prioritized returns a rate-limited work queue whose storage hands out
// first the items urgent says are urgent.
func prioritized[T comparable](name string, provider workqueue.MetricsProvider, limiter workqueue.TypedRateLimiter[T],
	urgent func(T) bool) workqueue.TypedRateLimitingInterface[T] {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[T]{Name: name, MetricsProvider: provider, Queue: newPriorityQueue(urgent)})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[T]{Name: name, MetricsProvider: provider, Queue: q})
	return workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[T]{Name: name, DelayingQueue: delaying})
}
