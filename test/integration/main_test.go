// Package integration runs the attach/detach controller in-process against a
// real etcd and kube-apiserver (test/framework), with a test stand-in for the
// CSI external-attacher (framework.Attacher). The "kubelet" is the test itself:
// it sets node readiness and node.status.volumesInUse.
//
// One cluster serves the whole package. Each test works in a namespace of its
// own, with node, driver and PV names of its own, and runs its own controller,
// stopped when the test ends: tests do not see each other's work.
package integration

import (
	"flag"
	"testing"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// cluster is the package's etcd and kube-apiserver, started by TestMain.
var cluster *framework.Cluster

var controllerVerbosity = flag.Int("controller-v", 2, "log verbosity of the controllers under test (logged through t.Log)")

func TestMain(m *testing.M) {
	framework.RunMain(m, framework.Options{
		// Tests delete PVCs and PVs; nothing else would remove their
		// protection finalizers.
		APIServerFlags: []string{"--disable-admission-plugins=StorageObjectInUseProtection"},
	}, func(c *framework.Cluster) { cluster = c })
}
