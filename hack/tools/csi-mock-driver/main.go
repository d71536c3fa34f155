// Command csi-mock-driver serves the in-memory mock CSI driver of the
// Kubernetes e2e tests (k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service)
// on a unix socket, so that a real csi-attacher can attach volumes in tests
// and benchmarks without any storage behind them.
//
// What the mock accepts, and so what a test must use:
//
//   - Node ID: the mock knows exactly one node, whose ID is the driver name.
//     ControllerPublish/Unpublish with any other node ID fail with NotFound, so
//     every CSINode must list this driver with nodeID = --driver-name (all
//     simulated nodes share it; the mock cannot tell them apart). With
//     --any-node-id, any node ID is accepted and ListVolumes reports each
//     volume published on the node IDs it was published to: one controller
//     endpoint serves the CSI external-attacher for many real kubelets, each
//     with a driver of its own (node mode, below).
//   - Volume handles (default mode): a handle must be the ID of a volume the
//     mock holds, else ControllerPublish fails with NotFound (a handy way to
//     make an attach fail). IDs are decimal counters: "1", "2" and "3" always
//     exist (built in), and every volume this program creates at start
//     (--volumes, then --preprovision) takes the next one, "4", "5", ...; the
//     program prints each "volume handle=<id> name=<name>" on stdout before
//     the socket appears, e.g. `volume handle="4" name="a"`.
//   - Volume handles with --any-handle: any handle works. The handle is used
//     as the mock volume's name and the volume is created on first use, so a
//     PV can carry any volumeHandle (and --volumes names are handles too).
//     Handles are case-insensitive (the mock compares with EqualFold).
//
// The mock reports every volume it holds as published on its one node in
// ListVolumes; the attacher's periodic reconcile therefore never un-attaches.
//
// Provisioning, for the CSI external-provisioner: the mock advertises
// CREATE_DELETE_VOLUME. With --any-handle a created volume's ID is the name
// the provisioner asked for (pvc-<uid>), the handle every other call then
// uses; DeleteVolume of an unknown handle succeeds (it is idempotent).
// Topology (--topology, --zone): the plugin advertises
// VOLUME_ACCESSIBILITY_CONSTRAINTS under one key, --topology-key
// (topology.kubernetes.io/zone by default). In node mode NodeGetInfo reports
// {key: --zone}; CreateVolume places the volume in the zone the request
// prefers first, else the first it requires, and returns that as the
// volume's accessible topology, which the provisioner turns into the PV's
// node affinity. A request without requirements makes a volume reachable
// from everywhere.
//
// Node mode, for a real kubelet (hack/tools/hollow-node): --node-id sets the
// node ID NodeGetInfo reports (kubelet writes it to the node's CSINode and the
// attacher passes it to ControllerPublish), and --kubelet-registration-dir,
// kubelet's <root-dir>/plugins_registry, makes the driver register with that
// kubelet as node-driver-registrar does: it serves the plugin registration
// service (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on
// <dir>/<driver-name>-reg.sock, naming --endpoint as the CSI socket. The node
// service stages and publishes any handle with --any-handle, so the kubelet's
// volume manager mounts the volume and the pod runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// options are the command line flags.
type options struct {
	endpoint        string
	driverName      string
	attachRequired  bool
	volumes         string
	preprovision    int
	anyHandle       bool
	anyNodeID       bool
	nodeID          string
	registrationDir string
	topology        bool
	topologyKey     string
	zone            string
	stopTimeout     time.Duration
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoint, "endpoint", "", "Unix socket to serve CSI on: a path or unix:///path (required).")
	fs.StringVar(&o.driverName, "driver-name", "mock.csi.example.com", "CSI driver name; also the only node ID the mock accepts.")
	fs.BoolVar(&o.attachRequired, "attach-required", true, "Advertise the PUBLISH_UNPUBLISH_VOLUME controller capability (ControllerPublish/Unpublish). When false they return Unimplemented and csi-attacher marks VolumeAttachments attached without calling the driver.")
	fs.StringVar(&o.volumes, "volumes", "", "Comma-separated volume names to create at start, before the socket is served.")
	fs.IntVar(&o.preprovision, "preprovision", 0, "Number of further volumes to create at start, named mock-vol-1 ... mock-vol-N.")
	fs.BoolVar(&o.anyHandle, "any-handle", false, "Accept any volume handle: a handle names a mock volume, created on first use.")
	fs.BoolVar(&o.anyNodeID, "any-node-id", false, "Accept ControllerPublish/Unpublish for any node ID (one controller endpoint for many nodes' drivers).")
	fs.StringVar(&o.nodeID, "node-id", "", "Node ID that NodeGetInfo reports. Default: --driver-name.")
	fs.StringVar(&o.registrationDir, "kubelet-registration-dir", "", "Kubelet's plugins_registry directory: register the driver with that kubelet through <dir>/<driver-name>-reg.sock.")
	fs.BoolVar(&o.topology, "topology", false, "Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS: CreateVolume places a volume in the zone the request prefers (else the first it requires) and reports it as the volume's accessible topology {--topology-key: zone}. Implied by --zone.")
	fs.StringVar(&o.topologyKey, "topology-key", defaultTopologyKey, "The topology segment key of --topology and --zone.")
	fs.StringVar(&o.zone, "zone", "", "Node mode: the zone NodeGetInfo reports as the node's accessible topology {--topology-key: zone}; kubelet writes it to the node's labels and the key to its CSINode.")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 5*time.Second, "How long in-flight calls may finish at shutdown before they are cut.")
}

func (o *options) validate() error {
	if o.endpoint == "" {
		return errors.New("--endpoint is required")
	}
	if o.driverName == "" {
		return errors.New("--driver-name must not be empty")
	}
	if o.preprovision < 0 {
		return fmt.Errorf("--preprovision must be >= 0, got %d", o.preprovision)
	}
	if (o.topology || o.zone != "") && o.topologyKey == "" {
		return errors.New("--topology-key must not be empty with --topology or --zone")
	}
	return nil
}

// topologyOn says whether the driver reports topology.
func (o *options) topologyOn() bool { return o.topology || o.zone != "" }

// volumeNames lists the volumes to create at start, in creation order.
func (o *options) volumeNames() []string {
	var names []string
	for _, n := range strings.Split(o.volumes, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	for i := 1; i <= o.preprovision; i++ {
		names = append(names, fmt.Sprintf("mock-vol-%d", i))
	}
	return names
}

// socketPath accepts "unix:///path", "unix://path" and a plain path.
func socketPath(endpoint string) (string, error) {
	p := endpoint
	if rest, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		p = rest
	} else if strings.Contains(endpoint, "://") {
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported", endpoint)
	}
	if p == "" {
		return "", fmt.Errorf("endpoint %q has no path", endpoint)
	}
	return p, nil
}

func main() {
	fs := flag.NewFlagSet(filepath.Base(os.Args[0]), flag.ExitOnError)
	var opts options
	opts.addFlags(fs)
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		fs.Usage()
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithValues("driver", opts.driverName)
	ctx = klog.NewContext(ctx, logger)

	err := run(ctx, opts, os.Stdout)
	if err != nil {
		logger.Error(err, "csi-mock-driver failed")
	}
	klog.Flush()
	if err != nil {
		os.Exit(1)
	}
}

// run serves the mock until ctx is cancelled and returns once the server has
// stopped and the socket is removed.
func run(ctx context.Context, opts options, out io.Writer) error {
	logger := klog.FromContext(ctx)
	path, err := socketPath(opts.endpoint)
	if err != nil {
		return err
	}

	mock := service.New(service.Config{
		DriverName:    opts.driverName,
		DisableAttach: !opts.attachRequired,
	})
	ctrl := &driver{Service: mock, anyHandle: opts.anyHandle, anyNodeID: opts.anyNodeID, name: opts.driverName, nodeID: opts.nodeID}
	if opts.topologyOn() {
		ctrl.topologyKey, ctrl.zone = opts.topologyKey, opts.zone
	}

	// Volumes exist before the socket does: a client that sees the socket
	// can use every printed handle.
	for _, name := range opts.volumeNames() {
		if _, err := createVolume(ctx, ctrl, name); err != nil {
			return err
		}
	}
	if err := printVolumes(ctx, ctrl, out); err != nil {
		return err
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	defer func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Failed to remove socket", "path", path)
		}
	}()

	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls(logger)))
	csi.RegisterIdentityServer(srv, ctrl)
	csi.RegisterControllerServer(srv, ctrl)
	csi.RegisterNodeServer(srv, ctrl)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	logger.Info("Serving mock CSI driver", "endpoint", path, "attachRequired", opts.attachRequired, "anyHandle", opts.anyHandle, "anyNodeID", opts.anyNodeID, "nodeID", ctrl.nodeIDOrName(), "topologyKey", ctrl.topologyKey, "zone", ctrl.zone)

	// Kubelet dials the CSI socket once it has the registration socket:
	// the CSI socket comes first.
	var regErr <-chan error
	if opts.registrationDir != "" {
		reg, err := startRegistration(ctx, opts.registrationDir, opts.driverName, path)
		if err != nil {
			srv.Stop()
			<-serveErr
			return err
		}
		defer reg.stop()
		regErr = reg.done
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve CSI on %s: %w", path, err)
	case err := <-regErr:
		srv.Stop()
		<-serveErr
		return err
	case <-ctx.Done():
	}
	logger.Info("Shutting down")
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(opts.stopTimeout):
		logger.Info("In-flight calls did not finish in time, stopping hard", "timeout", opts.stopTimeout)
		srv.Stop()
		<-stopped
	}
	// Serve returns nil after (Graceful)Stop.
	if err := <-serveErr; err != nil {
		return fmt.Errorf("serve CSI on %s: %w", path, err)
	}
	return nil
}

// createVolume creates (or finds: CreateVolume is idempotent by name) the
// mock volume called name and returns its ID. The mock only checks that a
// capability is given.
func createVolume(ctx context.Context, mock csi.ControllerServer, name string) (string, error) {
	resp, err := mock.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		return "", fmt.Errorf("create mock volume %q: %w", name, err)
	}
	return resp.GetVolume().GetVolumeId(), nil
}

// printVolumes writes one `volume handle="<handle>" name="<name>"` line per
// volume the mock holds: the handle is what a PV's volumeHandle must be.
func printVolumes(ctx context.Context, mock csi.ControllerServer, out io.Writer) error {
	resp, err := mock.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		return fmt.Errorf("list mock volumes: %w", err)
	}
	for _, e := range resp.GetEntries() {
		v := e.GetVolume()
		if _, err := fmt.Fprintf(out, "volume handle=%q name=%q\n", v.GetVolumeId(), v.GetVolumeContext()["name"]); err != nil {
			return fmt.Errorf("print volumes: %w", err)
		}
	}
	return nil
}

// driver guards the mock's controller and node services. The mock hands out
// volumes whose VolumeContext maps it keeps mutating under its own lock,
// while gRPC marshals responses after the handler returned: ListVolumes and
// ControllerPublish racing that way crash with a concurrent map access. So
// calls are serialized and ListVolumes answers with a deep copy.
//
// With anyHandle, any volume handle names a mock volume (the mock itself only
// knows the IDs it generated): the handle is the volume's name, created on
// first use, and ListVolumes reports names as IDs so that csi-attacher's
// reconcile finds the handles it attached.
//
// With anyNodeID, the mock is given its own node ID for every node and the
// node IDs a volume is published to are kept here, for ListVolumes.
type driver struct {
	service.Service
	anyHandle bool
	anyNodeID bool
	name      string
	// nodeID is what NodeGetInfo reports; empty: the mock's own (name).
	nodeID string
	// topologyKey, when set, turns topology on (provision.go); zone is
	// the node's, in node mode.
	topologyKey string
	zone        string

	mu sync.Mutex
	// published holds, per volume ID, the node IDs it is published to
	// (anyNodeID only).
	published map[string]map[string]bool
}

var (
	_ csi.ControllerServer = (*driver)(nil)
	_ csi.NodeServer       = (*driver)(nil)
	_ csi.IdentityServer   = (*driver)(nil)
)

// volumeID maps a handle to the mock's volume ID. Called with mu held.
func (c *driver) volumeID(ctx context.Context, handle string) (string, error) {
	if !c.anyHandle || handle == "" {
		return handle, nil
	}
	return createVolume(ctx, c.Service, handle)
}

func (c *driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	node := req.NodeId
	if c.anyNodeID && node != "" {
		req.NodeId = c.name
	}
	resp, err := c.Service.ControllerPublishVolume(ctx, req)
	if err == nil && c.anyNodeID {
		if c.published == nil {
			c.published = map[string]map[string]bool{}
		}
		if c.published[id] == nil {
			c.published[id] = map[string]bool{}
		}
		c.published[id][node] = true
	}
	return resp, err
}

func (c *driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	if !c.anyNodeID {
		return c.Service.ControllerUnpublishVolume(ctx, req)
	}
	// The mock keeps one publication for all nodes: it is withdrawn when
	// the last node's is.
	node := req.NodeId
	nodes := c.published[id]
	if node != "" && !nodes[node] {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if node == "" {
		clear(nodes)
	} else {
		delete(nodes, node)
	}
	if len(nodes) > 0 {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	delete(c.published, id)
	req.NodeId = c.name
	return c.Service.ControllerUnpublishVolume(ctx, req)
}

func (c *driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.ListVolumes(ctx, req)
	if err != nil {
		return nil, err
	}
	resp = proto.CloneOf(resp)
	for _, e := range resp.GetEntries() {
		id := e.GetVolume().GetVolumeId()
		if c.anyNodeID && e.GetStatus() != nil {
			e.Status.PublishedNodeIds = slices.Sorted(maps.Keys(c.published[id]))
		}
		if c.anyHandle {
			if name := e.GetVolume().GetVolumeContext()["name"]; name != "" {
				e.Volume.VolumeId = name
			}
		}
	}
	return resp, nil
}

func (c *driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	resp, err := c.Service.ControllerGetVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	return proto.CloneOf(resp), nil
}

// logCalls logs every CSI call: errors always, successes at -v=2, full
// requests and responses at -v=5.
func logCalls(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		logger := logger.WithValues("method", info.FullMethod)
		ctx = klog.NewContext(ctx, logger)
		resp, err := handler(ctx, req)
		switch {
		case err != nil:
			logger.Error(err, "CSI call failed", "request", req)
		case logger.V(5).Enabled():
			logger.V(5).Info("CSI call", "request", req, "response", resp)
		default:
			logger.V(2).Info("CSI call")
		}
		return resp, err
	}
}
