// Package framework runs a real, throw-away control plane for integration
// tests: one etcd and one kube-apiserver, built by hack/build-tools.sh into
// _output/bin, listening on free 127.0.0.1 ports, with all state in one temp
// directory.
//
// Nothing else runs: no scheduler, no kubelet, no controller-manager. The
// object helpers therefore write what those components would have written
// (a Ready node condition, a bound PV/PVC pair) directly, so that a test sees
// the cluster state a controller expects without waiting for another
// component. Where a test needs the CSI external-attacher, an Attacher
// stands in for it.
//
// The controller under test runs through StartController (StartControllerT
// for one test): in this process (app.Run) or as its binary, with one way to
// wait for it to be ready and one Stop that says whether it ended cleanly,
// whichever the test package.
//
// Lifetime. Children run in their own process group, which Stop kills, and
// with a parent-death signal, so that a test binary that dies (a panic in a
// test, -timeout) takes them along. The temp directory of such a binary cannot
// be removed by it; the next Start removes directories whose owner process is
// gone.
//
// Use StartT for a cluster per test, or RunMain in TestMain for one shared by
// a package: a start costs seconds, and tests sharing a cluster isolate
// themselves with a namespace of their own and unique cluster-scoped names.
package framework
