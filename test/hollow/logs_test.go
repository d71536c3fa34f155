package hollow

import (
	"regexp"
	"strings"
)

// complaints are what kubelet logs when the attach/detach controller's
// node status does not agree with its own view of a volume: a volume it
// waits for that node.status.volumesAttached does not list under the
// unique name kubelet computes, or a status it fails to write.
var complaints = regexp.MustCompile(strings.Join([]string{
	`Volume not attached according to node status`,
	`VerifyControllerAttachedVolume failed`,
	`Error updating node status`,
	`Unable to update node status`,
	`MountVolume\.WaitForAttach failed`,
	`MountVolume\.MountDevice failed`,
	`MountVolume\.SetUp failed`,
	`UnmountDevice failed`,
	`Multi-Attach`,
}, "|"))

// notComplaints are lines complaints matches that say nothing of the
// controller: a status write before the kubelet registered its Node.
var notComplaints = regexp.MustCompile(`error getting node \\?"[^"\\]*\\?": node \\?"[^"\\]*\\?" not found`)

// kubeletComplaints returns the lines of log that complain.
func kubeletComplaints(log string) []string {
	var found []string
	for line := range strings.Lines(log) {
		if complaints.MatchString(line) && !notComplaints.MatchString(line) {
			found = append(found, strings.TrimSpace(line))
		}
	}
	return found
}

// logMark is where each node's kubelet log ends at a point of a scenario.
type logMark map[string]int

// mark returns the current end of every kubelet log of the env.
func (e *env) mark() logMark {
	e.t.Helper()
	m := logMark{}
	for _, n := range e.nodes {
		log, err := n.KubeletLog()
		if err != nil {
			e.t.Fatal(err)
		}
		m[n.Name] = len(log)
	}
	return m
}

// checkKubeletLogs fails the test if a kubelet of the env complained about
// the controller's node status or names since its start.
func (e *env) checkKubeletLogs() {
	e.t.Helper()
	e.checkKubeletLogsSince(nil)
}

// checkKubeletLogsSince is checkKubeletLogs from since on (a node missing
// from since: from its start): a kubelet whose pod waits for a volume
// attached elsewhere rightly says it is not attached until it is.
func (e *env) checkKubeletLogsSince(since logMark) {
	e.t.Helper()
	for _, n := range e.nodes {
		log, err := n.KubeletLog()
		if err != nil {
			e.t.Fatal(err)
		}
		if found := kubeletComplaints(log[since[n.Name]:]); len(found) > 0 {
			e.t.Errorf("kubelet of %s complained %d times about node status or volume names; first: %s", n.Name, len(found), found[0])
		}
	}
}
