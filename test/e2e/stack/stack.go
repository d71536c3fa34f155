package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The CSI drivers the stack serves by default.
const (
	// MockDriver attaches plain CSI volumes.
	MockDriver = "mock.csi.example.com"
	// EBSDriver is the CSI driver that in-tree kubernetes.io/aws-ebs volumes
	// migrate to.
	EBSDriver = "ebs.csi.aws.com"
)

const (
	// startTimeout bounds the wait for one component to be ready.
	startTimeout = 60 * time.Second
	// StopGrace is how long a component may take to exit after SIGTERM at
	// Stop before it is killed.
	StopGrace = 5 * time.Second
	// portAttempts bounds the retries of a component that lost its port to
	// another process between FreePort and its bind.
	portAttempts = 3
)

// Binaries the stack runs besides etcd and kube-apiserver, as named in
// BinDir (hack/build-tools.sh and the Makefile build them there).
const (
	ControllerBinary   = "attach-detach-controller"
	KubeletsimBinary   = "kubeletsim"
	AttacherBinary     = "csi-attacher"
	MockDriverBinary   = "csi-mock-driver"
	buildToolsHint     = "make demo, or hack/build-tools.sh etcd kube-apiserver csi-attacher csi-mock-driver"
	buildBinariesHints = "make demo, or go build -o _output/bin/ ./cmd/attach-detach-controller ./test/kubeletsim"
)

// Options configure Start. The zero value is a working configuration.
type Options struct {
	// BinDir holds etcd, kube-apiserver, csi-attacher and csi-mock-driver,
	// and the controller and kubeletsim unless set below. Default:
	// $ADC_BIN_DIR, else _output/bin in the module root.
	BinDir string
	// ControllerBinary and KubeletsimBinary override the binaries of BinDir.
	ControllerBinary string
	KubeletsimBinary string
	// Drivers each get a csi-mock-driver and a csi-attacher. Default:
	// MockDriver and EBSDriver.
	Drivers []string
	// APIServerFlags are appended to kube-apiserver's (see framework.Options).
	APIServerFlags []string
	// Topology makes the CSI drivers zonal, as cloud block storage is: each
	// driver's controller-side mock advertises
	// VOLUME_ACCESSIBILITY_CONSTRAINTS and places a volume it creates in
	// the zone asked for, and a hollow node's drivers report the node's
	// zone (its topology.kubernetes.io/zone label), which kubelet lists in
	// the CSINode. StartCluster sets it.
	Topology bool
	// Logger receives progress messages. The zero value discards them.
	Logger klog.Logger
}

// Stack is a running cluster with its CSI drivers and attachers; the
// controller and the simulated kubelets are started on demand.
type Stack struct {
	Cluster *framework.Cluster
	// Drivers are the CSI drivers served, each by a mock and an attacher.
	Drivers []string

	logger        klog.Logger
	binDir        string
	controllerBin string
	kubeletsimBin string
	topology      bool

	mu        sync.Mutex
	processes []*Process
	started   map[string]int // per base name, for unique log names
	stopOnce  sync.Once
	stopErr   error
}

// Start starts the cluster, then a mock driver and an attacher per driver.
// On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	started := time.Now()
	binDir, err := opts.binDir()
	if err != nil {
		return nil, err
	}
	bins := map[string]string{
		AttacherBinary:   filepath.Join(binDir, AttacherBinary),
		MockDriverBinary: filepath.Join(binDir, MockDriverBinary),
		ControllerBinary: opts.ControllerBinary,
		KubeletsimBinary: opts.KubeletsimBinary,
	}
	for name, hint := range map[string]string{ControllerBinary: buildBinariesHints, KubeletsimBinary: buildBinariesHints} {
		if bins[name] == "" {
			bins[name] = filepath.Join(binDir, name)
		}
		if err := checkBinary(bins[name], hint); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{AttacherBinary, MockDriverBinary} {
		if err := checkBinary(bins[name], buildToolsHint); err != nil {
			return nil, err
		}
	}
	drivers := opts.Drivers
	if len(drivers) == 0 {
		drivers = []string{MockDriver, EBSDriver}
	}

	cluster, err := framework.Start(framework.Options{BinDir: binDir, APIServerFlags: opts.APIServerFlags, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	s := &Stack{
		Cluster:       cluster,
		Drivers:       drivers,
		logger:        opts.Logger,
		binDir:        binDir,
		controllerBin: bins[ControllerBinary],
		kubeletsimBin: bins[KubeletsimBinary],
		topology:      opts.Topology,
		started:       map[string]int{},
	}
	for _, driver := range drivers {
		if err := s.startDriver(ctx, bins[MockDriverBinary], bins[AttacherBinary], driver); err != nil {
			return nil, errors.Join(err, s.Stop())
		}
	}
	s.logger.Info("Stack started", "drivers", drivers, "dir", cluster.Dir, "duration", time.Since(started).Round(time.Millisecond))
	return s, nil
}

// AddDriver starts a mock driver and an attacher for one more CSI driver,
// and creates its CSIDriver (attach required). It is not one of the
// stack's Drivers: a hollow node registers it when its options name it.
func (s *Stack) AddDriver(ctx context.Context, driver string) error {
	binDir := s.binDir
	if err := s.startDriver(ctx, filepath.Join(binDir, MockDriverBinary), filepath.Join(binDir, AttacherBinary), driver); err != nil {
		return err
	}
	_, err := framework.CreateCSIDriver(ctx, s.Cluster.Client, driver, new(true))
	return err
}

// startDriver starts the mock driver, waits for its socket, then starts the
// attacher on it.
func (s *Stack) startDriver(ctx context.Context, mockBin, attacherBin, driver string) error {
	socket := s.driverSocket(driver)
	args := []string{
		// Any node ID: each hollow node's driver reports its own.
		"--endpoint=" + socket, "--driver-name=" + driver, "--any-handle", "--any-node-id", "-v=2",
	}
	if s.topology {
		args = append(args, "--topology")
	}
	mock, err := s.start("csi-mock-driver-"+driver, mockBin, args...)
	if err != nil {
		return err
	}
	err = mock.WaitFor(ctx, startTimeout, "socket of "+mock.Name, func(context.Context) (bool, error) {
		info, err := os.Stat(socket)
		return err == nil && info.Mode()&os.ModeSocket != 0, nil
	})
	if err != nil {
		return err
	}
	_, err = s.start("csi-attacher-"+driver, attacherBin,
		"--csi-address="+socket,
		"--kubeconfig="+s.Cluster.Kubeconfig,
		// The defaults (5 / 10) would make the attacher, not the
		// controller, the bottleneck of a test that attaches a batch.
		"--kube-api-qps=50", "--kube-api-burst=100",
		// The default caps the backoff at 5 min; a test waits minutes less
		// for an attach that failed while the stack was starting.
		"--retry-interval-max=5s",
		"-v=2")
	if err != nil {
		return err
	}
	s.logger.V(1).Info("Driver started", "driver", driver, "socket", socket)
	return nil
}

// driverSocket is the controller socket of driver's mock: its attacher's
// and provisioner's.
func (s *Stack) driverSocket(driver string) string {
	return filepath.Join(s.Cluster.Dir, driver+".sock")
}

// start starts a process whose log is named after name (logName).
func (s *Stack) start(name, binary string, args ...string) (*Process, error) {
	name, logPath := s.logName(name)
	p, err := framework.StartLogged(name, logPath, binary, args...)
	if err != nil {
		return nil, err
	}
	s.track(p)
	return p, nil
}

// logName returns name, numbered from its second start on, and the path of
// its log in the stack's directory.
func (s *Stack) logName(name string) (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started[name]++
	if n := s.started[name]; n > 1 {
		name = name + "-" + strconv.Itoa(n)
	}
	return name, filepath.Join(s.Cluster.Dir, name+".log")
}

// track adds p to the processes Stop stops.
func (s *Stack) track(p *Process) {
	s.mu.Lock()
	s.processes = append(s.processes, p)
	s.mu.Unlock()
	s.logger.V(2).Info("Started process", "name", p.Name, "pid", p.Pid(), "log", p.LogPath)
}

// Processes returns every process started, running or not, in start order.
func (s *Stack) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Process(nil), s.processes...)
}

// Stop stops every process (SIGTERM, then SIGKILL after a grace period),
// the cluster, and removes the directory. It may be called more than once.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		var wg sync.WaitGroup
		procs := s.Processes()
		stopErrs := make([]error, len(procs))
		for i, p := range procs {
			wg.Go(func() { stopErrs[i] = p.Stop(StopGrace) })
		}
		wg.Wait()
		errs = append(errs, stopErrs...)
		s.Cluster.Stop()
		s.stopErr = errors.Join(errs...)
		s.logger.V(1).Info("Stack stopped")
	})
	return s.stopErr
}

func checkBinary(path, hint string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s (build it with %s): %w", filepath.Base(path), hint, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

func (o Options) binDir() (string, error) {
	if o.BinDir != "" {
		return o.BinDir, nil
	}
	if dir := os.Getenv(framework.BinDirEnv); dir != "" {
		return dir, nil
	}
	root, err := framework.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("%w; set %s", err, framework.BinDirEnv)
	}
	return filepath.Join(root, "_output", "bin"), nil
}

// Build builds the controller and kubeletsim from the module's source into
// dir, and returns Options using them. A binary named by $ADC_CONTROLLER_BINARY
// or $ADC_KUBELETSIM_BINARY (framework.ControllerBinaryEnv, KubeletsimBinaryEnv)
// is used as it is.
func Build(ctx context.Context, dir string) (Options, error) {
	root, err := framework.ModuleRoot()
	if err != nil {
		return Options{}, err
	}
	var opts Options
	for _, b := range []struct {
		path *string
		env  string
		name string
		pkg  string
	}{
		{&opts.ControllerBinary, framework.ControllerBinaryEnv, ControllerBinary, "./cmd/attach-detach-controller"},
		{&opts.KubeletsimBinary, framework.KubeletsimBinaryEnv, KubeletsimBinary, "./test/kubeletsim"},
	} {
		bin, err := framework.PrebuiltBinary(b.env)
		if err != nil {
			return Options{}, err
		}
		if bin == "" {
			bin = filepath.Join(dir, b.name)
			cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, b.pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				return Options{}, fmt.Errorf("go build %s: %w: %s", b.pkg, err, out)
			}
		}
		*b.path = bin
	}
	return opts, nil
}

// StartBuilt builds the controller and kubeletsim from the module's source
// into a temporary directory, starts the stack on it (apiserverFlags
// appended to kube-apiserver's) and creates a CSIDriver, attach required,
// for each driver. stop stops everything and removes the binaries.
func StartBuilt(ctx context.Context, logger klog.Logger, apiserverFlags ...string) (st *Stack, stop func() error, err error) {
	dir, err := os.MkdirTemp("", "adc-stack-bin-")
	if err != nil {
		return nil, nil, err
	}
	removeBin := func() { _ = os.RemoveAll(dir) } // binaries only; the OS cleans /tmp
	opts, err := Build(ctx, dir)
	if err != nil {
		removeBin()
		return nil, nil, err
	}
	opts.Logger = logger
	opts.APIServerFlags = apiserverFlags
	st, err = Start(ctx, opts)
	if err != nil {
		removeBin()
		return nil, nil, err
	}
	stop = func() error {
		defer removeBin()
		return st.Stop()
	}
	for _, d := range st.Drivers {
		if _, err := framework.CreateCSIDriver(ctx, st.Cluster.Client, d, new(true)); err != nil {
			return nil, nil, errors.Join(err, stop())
		}
	}
	return st, stop, nil
}
