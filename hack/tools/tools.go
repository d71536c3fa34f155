//go:build tools

// Package tools pins the binaries the tests and benchmarks run against: a real
// kube-apiserver, etcd and kube-controller-manager, all built from source, the
// CSI external-attacher that turns VolumeAttachments into ControllerPublish calls.
// ./kustomize renders the manifests as kubectl kustomize would,
// ./csi-mock-driver is the CSI driver of the end-to-end tests, and
// ./hollow-node is the real kubelet with a fake container runtime (kubemark's
// hollow node, controller attach/detach on).
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
