// Package deploy checks what operators deploy, against a real kube-apiserver:
//
//   - manifests/ renders with kustomize (the build kubectl kustomize runs) and
//     the API server accepts the render (server-side dry-run), overlay
//     included;
//   - the controller binary, run with the Deployment's own arguments and the
//     ClusterRole's service account token, attaches and detaches, and the API
//     server's audit log shows every granted verb used and none refused;
//     without a verb the flow stops where that verb is needed;
//   - every metric /metrics serves is in docs/metrics.md, and every metric the
//     alert rules and the Grafana dashboard use is too;
//   - the cut-over of docs/operations.md: kube-controller-manager's
//     attachdetach controller attaches, is stopped, this controller takes
//     over, and back, with no VolumeAttachment deleted;
//   - shadow mode (manifests/overlays/shadow) beside kube-controller-manager:
//     agreement where both agree, the known differences reported, no write
//     but the Lease in the audit log.
//
// It needs, in _output/bin (or $ADC_BIN_DIR): etcd, kube-apiserver, kustomize
// and kube-controller-manager, built by hack/build-tools.sh.
package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

var (
	cluster *framework.Cluster
	// binary is the controller, built for this run.
	binary string
	// tools holds kustomize and kube-controller-manager.
	tools toolPaths
	// auditLog is the API server's audit log of the controller's service
	// account (see auditPolicy).
	auditLog string
	// repoRoot is the module root, where manifests/ and docs/ are.
	repoRoot string
)

type toolPaths struct {
	kustomize             string
	kubeControllerManager string
}

// auditPolicy records, at metadata level, every request of the controller's
// service account and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["` + controllerUser + `"]
  - level: None
`

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if repoRoot, err = framework.ModuleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binDir := os.Getenv(framework.BinDirEnv)
	if binDir == "" {
		binDir = filepath.Join(repoRoot, "_output", "bin")
	}
	for path, name := range map[*string]string{&tools.kustomize: "kustomize", &tools.kubeControllerManager: "kube-controller-manager"} {
		p := filepath.Join(binDir, name)
		if info, err := os.Stat(p); err != nil || info.Mode()&0o111 == 0 {
			fmt.Fprintf(os.Stderr, "%s: not an executable (build it with hack/build-tools.sh %s)\n", p, name)
			return 1
		}
		*path = p
	}

	dir, err := os.MkdirTemp("", "adc-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if binary, err = framework.BuildController(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	auditLog = filepath.Join(dir, "audit.log")
	c, err := framework.Start(framework.Options{
		APIServerFlags: []string{
			"--audit-policy-file=" + policy,
			"--audit-log-path=" + auditLog,
			"--audit-log-mode=blocking",
			// Tests delete PVCs; no controller removes their finalizer.
			"--disable-admission-plugins=StorageObjectInUseProtection",
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Stop()
	cluster = c
	return m.Run()
}
