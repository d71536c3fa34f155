package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registration is the kubelet plugin registration service
// node-driver-registrar serves for a CSI driver: kubelet's plugin watcher
// finds the socket in its plugins_registry directory, calls GetInfo, dials the
// CSI endpoint it names (NodeGetInfo, then it writes the CSINode) and reports
// the outcome with NotifyRegistrationStatus.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	logger   klog.Logger
	driver   string
	endpoint string
}

var _ registerapi.RegistrationServer = (*registration)(nil)

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.logger.V(2).Info("Kubelet asks for plugin info")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !status.GetPluginRegistered() {
		r.logger.Error(errors.New(status.GetError()), "Kubelet refused the driver's registration")
	} else {
		r.logger.Info("Registered with kubelet")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// registrationServer serves registration until stop.
type registrationServer struct {
	srv  *grpc.Server
	path string
	done <-chan error
}

// startRegistration serves the registration socket <dir>/<driver>-reg.sock,
// naming endpoint (a socket path) as the driver's CSI socket.
func startRegistration(ctx context.Context, dir, driver, endpoint string) (*registrationServer, error) {
	logger := klog.FromContext(ctx).WithValues("registrationDir", dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create registration directory: %w", err)
	}
	endpoint, err := filepath.Abs(endpoint)
	if err != nil {
		return nil, fmt.Errorf("CSI endpoint %s: %w", endpoint, err)
	}
	path := filepath.Join(dir, driver+"-reg.sock")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registration{logger: logger, driver: driver, endpoint: endpoint})
	done := make(chan error, 1)
	go func() {
		if err := srv.Serve(lis); err != nil {
			done <- fmt.Errorf("serve registration on %s: %w", path, err)
		}
	}()
	logger.Info("Serving kubelet plugin registration", "socket", path)
	return &registrationServer{srv: srv, path: path, done: done}, nil
}

// stop stops serving and removes the socket: kubelet deregisters the driver.
func (r *registrationServer) stop() {
	r.srv.Stop()
	_ = os.Remove(r.path)
}
