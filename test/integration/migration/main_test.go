// Package migration tests CSI migration end to end against a real
// kube-apiserver: for each node, an in-tree volume (here awsElasticBlockStore)
// is attached through its CSI driver (a VolumeAttachment) or its in-tree
// plugin, as the node's CSINode, or else its CSINodeInfo, says; with neither,
// the volume waits, and an attached volume is never detached for lack of them.
//
// The controller runs in-process (app.Run), one instance per test, stopped at
// the end of the test: tests run one after the other, each in its own
// namespace with its own nodes and volumes. A test attacher stands in for the
// CSI external-attacher. Metrics are read from the controller's /metrics.
package migration

import (
	"context"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

var (
	cluster *framework.Cluster
	// crdErr is the outcome of installing the CSINodeInfo CRD, done once
	// before any test so that every controller instance serves it.
	crdErr error
)

func TestMain(m *testing.M) {
	framework.RunMain(m, framework.Options{}, func(c *framework.Cluster) {
		cluster = c
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		crdErr = installCSINodeInfoCRD(ctx, c.Config)
	})
}
