package framework

import "strings"

// KubeControllerManagerSynced reports whether kube-controller-manager's log
// (--controllers=attachdetach, --v=2) shows its attachdetach controller past
// the initial list of its informers. Before that, a pod that comes through
// the pod informer ahead of its node through the node informer is skipped,
// and kube-controller-manager finds it again only in its periodic relist of
// every pod, minutes later. Once the caches are synced, it adds every node
// listed and reads every pod at once, so a pod created after this line is
// handled when it comes.
func KubeControllerManagerSynced(log string) bool {
	_, after, started := strings.Cut(log, `"Starting attach detach controller"`)
	return started && strings.Contains(after, `"Caches are synced"`)
}

// KubeControllerManagerArgs is the command line every test runs
// kube-controller-manager with: its attachdetach controller alone, with
// kubeconfig's credentials (nothing issues service account tokens here),
// no leader election, no serving, and a FlexVolume directory of its own,
// flexDir (it would otherwise create one under /usr/libexec). extra is
// appended.
func KubeControllerManagerArgs(kubeconfig, flexDir string, extra ...string) []string {
	return KubeControllerManagerArgsWith(kubeconfig, flexDir, "attachdetach", extra...)
}

// KubeControllerManagerArgsWith is KubeControllerManagerArgs running the
// controllers --controllers lists, e.g. "*,-attachdetach" as a cluster that
// cut over runs it. (A second --controllers would add to the first, not
// replace it.)
func KubeControllerManagerArgsWith(kubeconfig, flexDir, controllers string, extra ...string) []string {
	return append([]string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + controllers,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--flex-volume-plugin-dir=" + flexDir,
		"--v=2",
	}, extra...)
}
