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
//     simulated nodes share it; the mock cannot tell them apart).
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
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
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
	endpoint       string
	driverName     string
	attachRequired bool
	volumes        string
	preprovision   int
	anyHandle      bool
	stopTimeout    time.Duration
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoint, "endpoint", "", "Unix socket to serve CSI on: a path or unix:///path (required).")
	fs.StringVar(&o.driverName, "driver-name", "mock.csi.example.com", "CSI driver name; also the only node ID the mock accepts.")
	fs.BoolVar(&o.attachRequired, "attach-required", true, "Advertise the PUBLISH_UNPUBLISH_VOLUME controller capability (ControllerPublish/Unpublish). When false they return Unimplemented and csi-attacher marks VolumeAttachments attached without calling the driver.")
	fs.StringVar(&o.volumes, "volumes", "", "Comma-separated volume names to create at start, before the socket is served.")
	fs.IntVar(&o.preprovision, "preprovision", 0, "Number of further volumes to create at start, named mock-vol-1 ... mock-vol-N.")
	fs.BoolVar(&o.anyHandle, "any-handle", false, "Accept any volume handle: a handle names a mock volume, created on first use.")
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
	return nil
}

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
	ctrl := &controller{Service: mock, anyHandle: opts.anyHandle}

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
	csi.RegisterIdentityServer(srv, mock)
	csi.RegisterControllerServer(srv, ctrl)
	csi.RegisterNodeServer(srv, mock)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	logger.Info("Serving mock CSI driver", "endpoint", path, "attachRequired", opts.attachRequired, "anyHandle", opts.anyHandle)

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve CSI on %s: %w", path, err)
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

// controller guards the mock's controller service. The mock hands out
// volumes whose VolumeContext maps it keeps mutating under its own lock,
// while gRPC marshals responses after the handler returned: ListVolumes and
// ControllerPublish racing that way crash with a concurrent map access. So
// calls are serialized and ListVolumes answers with a deep copy.
//
// With anyHandle, any volume handle names a mock volume (the mock itself only
// knows the IDs it generated): the handle is the volume's name, created on
// first use, and ListVolumes reports names as IDs so that csi-attacher's
// reconcile finds the handles it attached.
type controller struct {
	service.Service
	anyHandle bool
	mu        sync.Mutex
}

var _ csi.ControllerServer = (*controller)(nil)

// volumeID maps a handle to the mock's volume ID. Called with mu held.
func (c *controller) volumeID(ctx context.Context, handle string) (string, error) {
	if !c.anyHandle || handle == "" {
		return handle, nil
	}
	return createVolume(ctx, c.Service, handle)
}

func (c *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.CreateVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	return proto.CloneOf(resp), nil
}

func (c *controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.ControllerPublishVolume(ctx, req)
}

func (c *controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.ControllerUnpublishVolume(ctx, req)
}

func (c *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.ListVolumes(ctx, req)
	if err != nil {
		return nil, err
	}
	resp = proto.CloneOf(resp)
	if c.anyHandle {
		for _, e := range resp.GetEntries() {
			if name := e.GetVolume().GetVolumeContext()["name"]; name != "" {
				e.Volume.VolumeId = name
			}
		}
	}
	return resp, nil
}

func (c *controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
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
