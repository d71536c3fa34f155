package controller

import (
	"k8s.io/client-go/util/workqueue"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// ranks is how many ranks a priorityQueue has: budget.Move, budget.Attach,
// budget.Other.
const ranks = budget.Other + 1

// priorityQueue is the storage of a work queue that hands out items by the
// rank rank gives them when they are added (or added again), the lowest
// first: a moved volume's steps go before a burst of new attaches, and a
// new pod's attach, and its node's status write, do not wait behind a
// teardown of every other volume. Items of one rank go first in, first
// out. A detach waits while attaches keep coming; each attach is one quick
// sync.
type priorityQueue[T comparable] struct {
	rank func(T) int
	// lists[r] holds the items of rank r; at says which list an item is
	// in, and an entry of another list is stale.
	lists [ranks][]T
	at    map[T]int
}

var _ workqueue.Queue[string] = (*priorityQueue[string])(nil)

func newPriorityQueue[T comparable](rank func(T) int) *priorityQueue[T] {
	return &priorityQueue[T]{rank: rank, at: map[T]int{}}
}

// rankOf is rank's answer, within the ranks there are.
func (q *priorityQueue[T]) rankOf(item T) int {
	return min(max(q.rank(item), 0), ranks-1)
}

func (q *priorityQueue[T]) Push(item T) {
	r := q.rankOf(item)
	q.lists[r] = append(q.lists[r], item)
	q.at[item] = r
}

// Touch moves an item added again ahead, when its rank has risen.
func (q *priorityQueue[T]) Touch(item T) {
	cur, ok := q.at[item]
	if !ok {
		return
	}
	if r := q.rankOf(item); r < cur {
		q.lists[r] = append(q.lists[r], item)
		q.at[item] = r
	}
}

func (q *priorityQueue[T]) Len() int { return len(q.at) }

// Pop is called only when Len is not 0.
func (q *priorityQueue[T]) Pop() T {
	var zero T
	for r := range q.lists {
		for len(q.lists[r]) > 0 {
			item := q.lists[r][0]
			q.lists[r][0] = zero
			q.lists[r] = q.lists[r][1:]
			if cur, ok := q.at[item]; ok && cur == r {
				delete(q.at, item)
				return item
			}
		}
	}
	return zero
}

// prioritized returns a rate-limited work queue whose storage hands out
// items by rank, the lowest first.
func prioritized[T comparable](name string, provider workqueue.MetricsProvider, limiter workqueue.TypedRateLimiter[T],
	rank func(T) int) workqueue.TypedRateLimitingInterface[T] {
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[T]{Name: name, MetricsProvider: provider, Queue: newPriorityQueue(rank)})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[T]{Name: name, MetricsProvider: provider, Queue: q})
	return workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[T]{Name: name, DelayingQueue: delaying})
}

// Rank and NodeRank are the ranks the volume queue and the node status
// queue give an item now (Reconciler.Rank, Reconciler.NodeRank): a driver
// that makes the queues itself (Config.NewQueue, NewKeyQueue) and chooses
// which item a worker takes can hand them out in the order these queues do.
func (c *Controller) Rank(k cache.Key) int { return c.reconciler.Rank(k) }

// NodeRank: see Rank.
func (c *Controller) NodeRank(node string) int { return c.reconciler.NodeRank(node) }
