package bench

import "testing"

func TestMoveSetSpreadsOverNodes(t *testing.T) {
	tests := []struct {
		nodes, podsPerNode, n int
		want                  []int
	}{
		{nodes: 50, podsPerNode: 10, n: 5, want: []int{0, 100, 200, 300, 400}},
		{nodes: 1000, podsPerNode: 10, n: 5, want: []int{0, 2000, 4000, 6000, 8000}},
		// Fewer volumes than asked for: each once.
		{nodes: 2, podsPerNode: 1, n: 5, want: []int{0, 1}},
	}
	for _, tt := range tests {
		w := NewWorkload("ours", "bench.csi.example.com", tt.nodes, tt.podsPerNode)
		got := w.MoveSet(tt.n)
		if len(got) != len(tt.want) {
			t.Fatalf("%dx%d: MoveSet(%d) = %v, want %v", tt.nodes, tt.podsPerNode, tt.n, got, tt.want)
		}
		nodes := map[int]bool{}
		for i, v := range got {
			if v != tt.want[i] {
				t.Errorf("%dx%d: MoveSet(%d) = %v, want %v", tt.nodes, tt.podsPerNode, tt.n, got, tt.want)
			}
			nodes[w.node[v]] = true
		}
		if len(nodes) != len(got) {
			t.Errorf("%dx%d: MoveSet(%d) = %v on %d nodes, want each on its own", tt.nodes, tt.podsPerNode, tt.n, got, len(nodes))
		}
	}
}

func TestBatchVolumesSpreadOverNodesAndMatchTheNamesControllersList(t *testing.T) {
	w := NewWorkload("ours", "bench.csi.example.com", 50, 10)
	b := teardownBatch(100)
	perNode := map[string]int{}
	for _, i := range b.First(b.Size) {
		perNode[w.batchNode(i)]++
	}
	if len(perNode) != 50 {
		t.Errorf("100 volumes on %d nodes, want all 50", len(perNode))
	}
	for node, n := range perNode {
		if n != 2 {
			t.Errorf("node %s has %d of the batch's volumes, want 2", node, n)
		}
	}
	e := newExpectation(w.Driver)
	e.addNode(w.batchNode(7))
	w.addBatch(e, b, []int{7})
	l := w.batchListing(b, 7)
	if !e.nodes[l.Node][l.Volume] {
		t.Errorf("listing %+v is not what the expectation awaits in node status: %v", l, e.nodes)
	}
	if b.pod(7, 1) == b.pod(7, 2) {
		t.Errorf("rounds 1 and 2 name volume 7's pod alike: %s", b.pod(7, 1))
	}
}
