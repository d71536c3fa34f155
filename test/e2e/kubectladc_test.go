package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestKubectlADC: a user asks `kubectl adc why pod/NAME` about a pod whose
// volume the real external-attacher attached and kubeletsim mounted: the
// controller's answer at its secure endpoint (its certificate verified),
// and the answer read from the objects.
func TestKubectlADC(t *testing.T) {
	e := newEnv(t, "adc", 1)
	v := e.createVolume("data")
	e.createPod("web", e.nodes[0], v.claim)
	e.waitAttached(v, e.nodes[0])

	plugin := buildKubectlADC(t)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(e.ctx, plugin, append(args, "--kubeconfig", st.Cluster.Kubeconfig)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl adc %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		t.Logf("kubectl adc %s:\n%s", strings.Join(args, " "), stdout.String())
		return stdout.String()
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{
			args: []string{"why", "pod/web", "-n", e.ns, "--endpoint", e.controller.URL, "--endpoint-ca", e.controller.CertFile},
			want: []string{
				"Answered by the controller (" + e.controller.URL + ")",
				v.name() + " on node " + e.nodes[0],
				"state:  attached, reported in the node's status.volumesAttached",
				"wanted: wanted by " + e.ns + "/web",
				"next:   nothing",
			},
		},
		{
			args: []string{"why", "pod/web", "-n", e.ns, "--client-side"},
			want: []string{
				"Answered from the objects",
				"VolumeAttachment " + v.vaName(e.nodes[0]) + " on node " + e.nodes[0] + ": attached",
				"in status.volumesInUse (mounted)",
				"=> attached, reported and mounted",
			},
		},
	} {
		out := run(tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("kubectl adc %s: output lacks %q", strings.Join(tc.args, " "), w)
			}
		}
	}
}

// buildKubectlADC builds cmd/kubectl-adc for the test.
func buildKubectlADC(t *testing.T) string {
	t.Helper()
	root, err := framework.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kubectl-adc")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-adc")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build kubectl-adc: %v: %s", err, out)
	}
	return bin
}
