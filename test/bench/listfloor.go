package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// ListStats is what a bare list of the kinds the controller reads took: the
// floor of its restart on this machine and API server.
type ListStats struct {
	// Synced is the time until every informer had its initial list.
	Synced time.Duration `json:"synced"`
	// CPU is the lister process's CPU time until then.
	CPU time.Duration `json:"cpu"`
	// Objects is the number of objects listed.
	Objects int `json:"objects"`
}

// ListEverything lists, with informers that keep what they read and do
// nothing else (no transform, no handler), the kinds the controller reads:
// pods, claims, PVs, nodes, CSINodes, CSIDrivers and VolumeAttachments. The
// client is the controller's: protobuf, no compression, client-go's
// default list (the watch stream, where the API server serves it). Run in a
// process of its own (adcbench list-floor), so that its CPU and heap are
// its own, as the controller's are.
func ListEverything(ctx context.Context, config *rest.Config) (ListStats, error) {
	config = rest.CopyConfig(config)
	config.QPS, config.Burst = 1000, 1000
	config.ContentType = runtime.ContentTypeProtobuf
	config.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	config.DisableCompression = true
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return ListStats{}, err
	}
	cpu0 := cpuTime()
	start := time.Now()
	f := informers.NewSharedInformerFactory(client, 0)
	all := []cache.SharedIndexInformer{
		f.Core().V1().Pods().Informer(),
		f.Core().V1().PersistentVolumeClaims().Informer(),
		f.Core().V1().PersistentVolumes().Informer(),
		f.Core().V1().Nodes().Informer(),
		f.Storage().V1().CSINodes().Informer(),
		f.Storage().V1().CSIDrivers().Informer(),
		f.Storage().V1().VolumeAttachments().Informer(),
	}
	stop := make(chan struct{})
	defer func() { close(stop); f.Shutdown() }()
	f.Start(stop)
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return ListStats{}, fmt.Errorf("list floor: %v not listed: %w", typ, context.Cause(ctx))
		}
	}
	s := ListStats{Synced: time.Since(start), CPU: cpuTime() - cpu0}
	for _, inf := range all {
		s.Objects += len(inf.GetStore().ListKeys())
	}
	return s, nil
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// listFloor runs Config.ListFloor, a command that runs ListEverything
// against the cluster and prints its ListStats as JSON.
func (r *runner) listFloor(ctx context.Context) (ListStats, error) {
	argv := r.cfg.ListFloor
	if len(argv) == 0 {
		return ListStats{}, fmt.Errorf("no list floor command")
	}
	ctx, cancel := context.WithTimeout(ctx, restartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], "-kubeconfig", r.env.Cluster.Kubeconfig)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return ListStats{}, fmt.Errorf("list floor: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var s ListStats
	if err := json.Unmarshal(out, &s); err != nil {
		return ListStats{}, fmt.Errorf("list floor: %w: %q", err, out)
	}
	return s, nil
}
