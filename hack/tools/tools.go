//go:build tools

// Package tools pins the binaries the tests and benchmarks run against: a real
// kube-apiserver, etcd, kube-controller-manager and kube-scheduler, all built
// from source, the CSI external-attacher that turns VolumeAttachments into
// ControllerPublish calls and the CSI external-provisioner that turns claims
// into CreateVolume calls and PersistentVolumes.
// ./kustomize renders the manifests as kubectl kustomize would,
// ./csi-mock-driver is the CSI driver of the end-to-end tests, and
// ./hollow-node is the real kubelet with a fake container runtime (kubemark's
// hollow node, controller attach/detach on).
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
