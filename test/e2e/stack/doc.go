// Package stack runs the whole attach/detach path on loopback, as processes:
// etcd and kube-apiserver (test/framework), this controller's binary, for each
// CSI driver a csi-mock-driver and the real CSI external-attacher on its
// socket, and kubeletsim playing the kubelets. Nothing is faked in between:
// the controller creates VolumeAttachments, csi-attacher calls
// ControllerPublish on the mock and marks them attached, kubeletsim mounts
// what node.status.volumesAttached lists.
//
// Two drivers run by default: MockDriver for CSI volumes and EBSDriver, the
// CSI driver of in-tree kubernetes.io/aws-ebs volumes, for migrated ones. The
// mock accepts only its own name as node ID, so every simulated node reports
// nodeID = driver name in its CSINode; and it runs with --any-handle, so any
// volume handle can be attached.
//
// Hollow nodes (StartHollowNode, StartHollowNodes) run the real kubelet
// instead, each with a mock driver of its own. StartCluster (cluster.go)
// adds the rest of a cluster as users run one: kube-scheduler,
// kube-controller-manager with every controller, the CSI
// external-provisioner per driver, zonal drivers, a WaitForFirstConsumer
// StorageClass and hollow nodes in zones; workloads.go and drain.go drive
// StatefulSets and drains as kubectl does, and WatchAttachments judges every
// attachment.
//
// The demo (hack/demo), the end-to-end tests (test/e2e), the tests on hollow
// nodes (test/hollow) and in a whole cluster (test/cluster) share it. Every
// process runs in its own process group with a parent-death signal and logs
// into the cluster's temp directory; Stop ends them and removes the directory.
package stack
