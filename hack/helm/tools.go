//go:build tools

// Package tools pins the helm command hack/build-helm.sh builds. This module
// is apart from hack/tools so that Helm's Kubernetes libraries need not be
// the controller's (see hack/build-helm.sh).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
