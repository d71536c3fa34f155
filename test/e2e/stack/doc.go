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
// The demo (hack/demo) and the end-to-end tests (test/e2e) share it. Every
// process runs in its own process group with a parent-death signal and logs
// into the cluster's temp directory; Stop ends them and removes the directory.
package stack
