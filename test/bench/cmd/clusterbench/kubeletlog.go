package main

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// unboundSkip is the kubelet's line for a pod whose claim it read before
// the claim's phase was Bound: kube-scheduler binds a pod once its claim
// names its volume, the PV controller writes the claim's phase Bound in a
// second write, and a kubelet that reads the claim in between skips the
// pod; its pod worker retries it 10 s later.
var unboundSkip = regexp.MustCompile(`"Unable to attach or mount volumes for pod; skipping pod" err=".*is not bound.*" node="[^"]*" pod="([^"/]+)/([^"]+)"`)

// kubeletSkips returns the pods of namespace ns that a kubelet of the
// cluster skipped because their claim was not Bound yet, read from the
// hollow nodes' logs in dir.
func kubeletSkips(dir, ns string) (map[string]bool, error) {
	logs, err := filepath.Glob(filepath.Join(dir, stack.HollowNodeBinary+"-*.log"))
	if err != nil {
		return nil, err
	}
	skipped := map[string]bool{}
	var errs []error
	for _, path := range logs {
		errs = append(errs, scanSkips(path, ns, skipped))
	}
	return skipped, errors.Join(errs...)
}

func scanSkips(path, ns string, skipped map[string]bool) (err error) {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read only
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for s.Scan() {
		line := s.Text()
		if !strings.Contains(line, "skipping pod") {
			continue
		}
		if m := unboundSkip.FindStringSubmatch(line); m != nil && m[1] == ns {
			skipped[m[2]] = true
		}
	}
	return s.Err()
}

// without is the phase without the named pods.
func (p phase) without(names map[string]bool) phase {
	out := phase{started: p.started}
	for i, n := range p.names {
		if !names[n] {
			out.names = append(out.names, n)
			out.pods = append(out.pods, p.pods[i])
		}
	}
	out.took = since(out.started, out.pods, mRunning)
	return out
}
