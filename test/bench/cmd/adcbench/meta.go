package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/bench"
)

// collectMeta describes the machine and the versions under test.
func collectMeta(root, binDir string, now time.Time) bench.Meta {
	// As run by make bench (go run names a temporary binary).
	m := bench.Meta{Date: now, Command: strings.Join(append([]string{"go run ./test/bench/cmd/adcbench"}, os.Args[1:]...), " ")}
	m.Machine = []string{
		"cores (nproc): " + output("nproc"),
		"memory: " + memTotal(),
		"CPU: " + cpuModel(),
		"kernel: " + firstLine("/proc/sys/kernel/osrelease"),
		"load average at start: " + loadAvg(),
	}
	k8s := goModVersion(filepath.Join(root, "hack", "tools", "go.mod"), "k8s.io/kubernetes")
	m.Versions = []string{
		"attach-detach-controller " + gitDescribe(root),
		"kube-controller-manager and kube-apiserver " + k8s + " (hack/tools/go.mod, built by hack/build-tools.sh)",
		"etcd " + strings.TrimPrefix(output(filepath.Join(binDir, "etcd"), "--version"), "etcd Version: "),
		"Go " + runtime.Version(),
	}
	return m
}

// notes explain the method in the report.
func notes(cfg bench.Config, ctrls []bench.Controller) []string {
	order := make([]string, 0, len(ctrls))
	for _, c := range ctrls {
		order = append(order, c.Title)
	}
	return []string{
		"One etcd and kube-apiserver (priority and fairness off, 3000/1000 requests in flight) for the whole run; controllers run one after the other (" +
			strings.Join(order, ", then ") + "), each on its own namespace and node set; the previous set is deleted before the next controller starts.",
		"Both controllers get the same `--kube-api-qps`/`--kube-api-burst` and run as their own service account bound to cluster-admin; " +
			"API requests are counted from the apiserver's audit log (Metadata level, those two users only), attributed to a phase by the time the apiserver received them. " +
			"Phases are contiguous: requests made during the pause after a phase count for that phase. kube-controller-manager posts its events with its rate-limited client; " +
			"ours uses a client of its own for events. Writes exclude events; the breakdown lists them.",
		"A test external-attacher in the harness (unthrottled client) adds its finalizer and the node-id annotation, then sets `status.attached`; " +
			"on deletion it removes its finalizer; it attaches at once but in the move phase, where each attach takes " + cfg.AttachDelay.String() + " (a driver's ControllerPublishVolume). " +
			"No kubelet runs: `volumesInUse` stays empty, so every detach is allowed at once, but for the move phase's moved volumes, which the harness lists there as their kubelet would. Nodes carry a kubelet-like status " +
			"(capacity, addresses, 10 images); pods have one container and one claim.",
		fmt.Sprintf("Times are measured by the harness's own informers, compared every %s, from the first pod write of the phase. ", cfg.Poll) +
			"burst: all pods created at once (32 in flight); \"half the volumes in node.status\" is when half the burst's volumes are first listed in their node's status " +
			"(kubelet mounts a volume only once it is listed there), a pod's median wait. churn: per round one pod per node is deleted and replaced by a pod on the next node using the same claim " +
			"(old attachment detached, then new one attached: ReadWriteOnce); done = old VolumeAttachments gone, new ones attached and every node.status exact. " +
			"teardown: every pod deleted; right after, one more pod, using a volume of its own (bound PV and claim created before the phase), on the canary node; " +
			"\"a new pod's VolumeAttachment attached\" and \"that volume in node.status too\" are its wait, from the pod's creation, while every other volume detaches " +
			"(an attach queued behind the detaches would wait about as long as \"every VolumeAttachment gone\"); the teardown's other milestones count that volume as expected " +
			"(its VolumeAttachment stays, the canary node's status lists it), and its writes are listed apart. " +
			fmt.Sprintf("move (after churn, everything attached): %d of the workload's volumes, on different nodes, are listed in their node's `status.volumesInUse` (mounted) before the clock starts; "+
				"then the harness creates a burst of %d new pods, each with a volume of its own (bound PVs and claims made before), spread over the nodes, and right after it moves each of those volumes to the next node as a StatefulSet moves a pod: "+
				"old pod deleted, the volume dropped from the old node's `volumesInUse` (a merge patch of that field, as its kubelet writes it on unmount), new pod created with the same claim on the next node. "+
				"A move's time runs from that unmount write's answer to the first comparison that finds the volume in the new node's `status.volumesAttached`; the target is %s plus the attacher's delay. "+
				"The burst's pods are then deleted and their volumes detached (those writes count for the phase). ", cfg.MoveVolumes, cfg.MoveBurst, bench.MoveTarget) +
			fmt.Sprintf("stream (after move): %d volumes, spread over the nodes, attached; all their pods deleted at once, until every VolumeAttachment of the set is gone (\"alone\"); "+
				"then attached again and torn down again while the harness creates new pods, each with a volume of its own, %g a second from the first deletion until the set is gone "+
				"(\"under the stream\"; the stream's VolumeAttachments do not count as left over). Target: under the stream at most %.1f times alone. "+
				"A stream pod's wait runs from its creation until its volume is in its node's status. The stream's pods are then deleted and their volumes detached. ", cfg.StreamTeardown, cfg.StreamRate, bench.StreamTarget) +
			"restart (after idle, everything attached): SIGTERM, then the same command again; right after the new process starts the harness creates one more volume " +
			"(bound PV and claim) and a pod using it on the canary node; ready = ours' /readyz answers 200 (state rebuilt, workers started), " +
			"kube-controller-manager's log says \"Caches are synced\" (it serves no /readyz with --secure-port=0; it rebuilds its state after that line, so this is earlier in its start than ours); " +
			"first attach = that volume attached and in node.status, from the new process's start; then the pod is deleted and the volume detached. " +
			"The restart's writes leave out those on the new volume's VolumeAttachment and node (listed apart): with everything attached and reported, starting needs none.",
		fmt.Sprintf("After each phase and each churn round the harness waits until the controller has made no API request for %s (its trailing work, mostly events, "+
			"counts for the phase: \"last API request\"), so that the next phase starts from a quiet controller and a full token bucket. "+
			"Discovery GETs do not count as work there; they are counted in the tables.", cfg.Quiet),
		fmt.Sprintf("API floor = (W − burst) / QPS with QPS=%g, burst=%d, W the writes no controller can avoid: burst VolumeAttachments: V creates; "+
			"burst node status: V creates + N node status patches; churn round moving v volumes across n nodes: v deletes + v creates + n status patches "+
			"(a controller that writes each change at once needs 2n: withdraw before the detach, report after the attach; the row \"against the floor of writing each change at once\" uses 2n); "+
			"teardown: V deletes + N status patches, the stream phase's teardowns too (its stream's pods, if served as they come, take a share of the budget the floor leaves to the teardown). "+
			"V volumes, N nodes. Each is a lower bound, not a target a correct controller always reaches.", cfg.QPS, cfg.Burst),
		fmt.Sprintf("CPU = utime+stime of the controller process from /proc/PID/stat (USER_HZ=100); RSS = VmRSS, peak = VmHWM from /proc/PID/status "+
			"(the run's peak: the higher of the process stopped by the restart and the one started by it). "+
			"Idle: %s with nothing changing, once the controller is quiet after the burst.", cfg.Idle),
		"The machine is shared and noisy: compare the controllers' ratios from the same run, not absolute values across runs.",
	}
}

func output(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

func loadAvg() string {
	f := strings.Fields(firstLine("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// fieldOf returns the value of the first "key: value" line of path whose
// key is key.
func fieldOf(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	var kib int64
	if _, err := fmt.Sscanf(fieldOf("/proc/meminfo", "MemTotal"), "%d kB", &kib); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB (MemTotal %d kB)", float64(kib)/(1<<20), kib)
}

func cpuModel() string { return fieldOf("/proc/cpuinfo", "model name") }

func gitDescribe(root string) string {
	cmd := exec.Command("git", "describe", "--tags", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// goModVersion returns the version a go.mod requires of module.
func goModVersion(path, module string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return "unknown"
}
