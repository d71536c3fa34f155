// Package kubectladc runs the kubectl-adc binary, as a user runs it with a
// kubeconfig, against a real kube-apiserver and the controller binary:
// the answer read from the objects when the controller can't be reached,
// and the controller's own answer when it can.
package kubectladc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

var (
	cluster *framework.Cluster
	// controller and plugin are the binaries under test.
	controller string
	plugin     string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "adc-kubectl-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if controller, err = framework.BuildController(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if plugin, err = buildPlugin(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return framework.Run(m, framework.Options{}, func(c *framework.Cluster) { cluster = c })
}

// buildPlugin builds cmd/kubectl-adc into dir, named as kubectl finds it.
func buildPlugin(dir string) (string, error) {
	root, err := framework.ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kubectl-adc")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-adc")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kubectl-adc: %w: %s", err, out)
	}
	return bin, nil
}

// adc runs `kubectl adc args...` with the admin kubeconfig and returns its
// output; a non-zero exit fails the test.
func adc(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runADC(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl adc %s:\n%s", strings.Join(args, " "), out)
	return out
}

func runADC(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, plugin, append(args, "--kubeconfig", cluster.Kubeconfig)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kubectl adc %s: %w\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// wantLines fails the test unless out holds every line of want, in order;
// each is matched as a substring of one line.
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		for i < len(lines) && !strings.Contains(lines[i], w) {
			i++
		}
		if i == len(lines) {
			t.Fatalf("output lacks %q (after the lines before it):\n%s", w, out)
		}
		i++
	}
}
