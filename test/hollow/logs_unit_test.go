package hollow

import "testing"

// TestKubeletComplaints checks the log filter on lines kubelet v1.37 wrote.
func TestKubeletComplaints(t *testing.T) {
	for _, tc := range []struct {
		line string
		want bool
	}{
		{`E1127 23:19:24.527576    1464 kubelet_node_status.go:479] "Error updating node status, will retry" err="error getting node \"n0\": node \"n0\" not found" node="n0"`, false},
		{`E1127 23:19:24.527576    1464 kubelet_node_status.go:479] "Error updating node status, will retry" err="Timeout: request did not complete" node="n0"`, true},
		{`E1127 23:19:24.527576    1464 nestedpendingoperations.go:348] Operation for "{volumeName:kubernetes.io/csi/mock.csi.example.com^h podName: nodeName:}" failed. No retries permitted until 2026-11-27 23:19:25 (durationBeforeRetry 500ms). Error: Volume not attached according to node status for volume "pvc" (UniqueName: "kubernetes.io/csi/mock.csi.example.com^h") pod "app" (UID: "u") node="n0"`, true},
		{`E1127 23:15:36.193912   31124 eviction_manager.go:272] "Eviction manager: failed to get HasDedicatedImageFs" err="imagefs device is not found" node="n0"`, false},
	} {
		if got := len(kubeletComplaints(tc.line)) > 0; got != tc.want {
			t.Errorf("complaint = %t, want %t: %s", got, tc.want, tc.line)
		}
	}
}
