package integration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// An API server whose WatchList feature is off (an operator's choice; the
// default of servers before v1.34) refuses the streaming list that the
// informers ask for first (client-go's WatchListClient). The informers then
// list as before, and the controller attaches and detaches as usual.
func TestWithoutWatchList(t *testing.T) {
	c := framework.StartTWithOptions(t, framework.Options{
		APIServerFlags: []string{"--feature-gates=WatchList=false", "--disable-admission-plugins=StorageObjectInUseProtection"},
	})
	e := newEnvOn(t, "no-watchlist", c)

	// The server has WatchList off: it refuses a watch that asks for the
	// initial events.
	w, err := e.client.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{
		SendInitialEvents:    new(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err == nil {
		w.Stop()
		t.Fatal("a watch with sendInitialEvents was accepted: the server has WatchList on")
	}
	t.Logf("streaming list refused, as wanted: %v", err)

	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.createPod("pod", node, "claim")
	e.startController(nil)
	e.waitAttached(driver, "vol-1", node)
	e.waitListed(node, framework.CSIVolumeName(driver, "vol-1"))

	e.deletePod("pod")
	e.waitDetached(driver, "vol-1", node)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1"))
		return !listed, err
	}, "node %s status no longer lists the volume", node)
}
