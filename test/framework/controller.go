package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) { return freePort() }

// Environment variables naming binaries built once for a whole test run (the
// Makefile sets them to its builds in _output/bin), so that each test package
// does not build and link its own copy. Unset, the tests build from source.
const (
	ControllerBinaryEnv = "ADC_CONTROLLER_BINARY"
	KubeletsimBinaryEnv = "ADC_KUBELETSIM_BINARY"
)

// PrebuiltBinary returns the binary that the environment variable env names,
// or "" if it is unset.
func PrebuiltBinary(env string) (string, error) {
	p := os.Getenv(env)
	if p == "" {
		return "", nil
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", env, p, err)
	}
	info, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %w", env, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s is not an executable file", env, p)
	}
	return abs, nil
}

// BuildController builds the controller binary into dir and returns its path;
// if $ADC_CONTROLLER_BINARY is set, it returns that binary instead.
func BuildController(dir string) (string, error) {
	if bin, err := PrebuiltBinary(ControllerBinaryEnv); bin != "" || err != nil {
		return bin, err
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "attach-detach-controller")
	cmd := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app.Version=test",
		"./cmd/attach-detach-controller")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build controller: %w: %s", err, out)
	}
	return bin, nil
}

// StartProcess starts binary with args for test t, in the test's working
// directory; its output goes to a log of its own (Output). It is killed at
// the end of the test if still running, and its log is echoed to the test
// log when the test fails.
func StartProcess(t testing.TB, binary string, args ...string) *Process {
	t.Helper()
	name := filepath.Base(binary)
	p, err := start(name, filepath.Join(t.TempDir(), name+".log"), "", binary, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(0); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("output of %s %s:\n%s", name, strings.Join(args, " "), p.Output())
		}
	})
	return p
}
