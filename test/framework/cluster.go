package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

const (
	// BinDirEnv overrides where Start looks for etcd and kube-apiserver.
	BinDirEnv = "ADC_BIN_DIR"
	// APIServerBinaryEnv names a kube-apiserver binary that Start runs
	// instead of the one in the bin directory: make test-skew runs the
	// same tests against other Kubernetes releases with it.
	APIServerBinaryEnv = "ADC_KUBE_APISERVER_BINARY"
	// DefaultStartTimeout is long because the first start after a build is
	// slow: the OS has yet to page in a 150 MB kube-apiserver binary.
	DefaultStartTimeout = 90 * time.Second
)

// Options configure Start. The zero value is a working configuration.
type Options struct {
	// BinDir holds the etcd and kube-apiserver binaries. Default: $ADC_BIN_DIR,
	// else _output/bin in the module root found above the working directory.
	BinDir string
	// APIServerBinary is the kube-apiserver to run. Default:
	// $ADC_KUBE_APISERVER_BINARY, else kube-apiserver in BinDir.
	APIServerBinary string
	// EtcdFlags and APIServerFlags are appended to the flags Start passes,
	// so a single-valued flag given here wins, while a list flag adds to
	// Start's: --disable-admission-plugins=StorageObjectInUseProtection
	// keeps ServiceAccount disabled too.
	EtcdFlags      []string
	APIServerFlags []string
	// StartTimeout bounds the start of both processes. Default:
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Logger receives progress messages. The zero value discards them.
	Logger klog.Logger
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Config authenticates as an admin in system:masters. Copy it
	// (rest.CopyConfig) before changing it.
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file equivalent to Config, for
	// processes under test.
	Kubeconfig string
	// Dir is the temp directory with all state and the processes' logs
	// (etcd.log, kube-apiserver.log). Stop removes it.
	Dir string
	// EtcdURL is the etcd client URL.
	EtcdURL string
	// ServiceAccountKeyFile is the RSA key (PEM) kube-apiserver signs and
	// verifies service account tokens with: kube-controller-manager's
	// --service-account-private-key-file.
	ServiceAccountKeyFile string
	// ServerVersion is the release kube-apiserver reports (/version).
	ServerVersion string

	logger    klog.Logger
	etcd      *Process
	apiserver *Process
	stopOnce  sync.Once
	stopErr   error
}

// Start starts etcd and kube-apiserver and returns once the apiserver is
// ready. On error nothing is left running and the error ends with the tail of
// each process's log.
func Start(opts Options) (*Cluster, error) {
	logger := opts.Logger
	ctx := klog.NewContext(context.Background(), logger)
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
	}
	binDir, err := opts.binDir()
	if err != nil {
		return nil, err
	}
	etcdBin, err := findBinary(binDir, "etcd")
	if err != nil {
		return nil, err
	}
	apiserverBin, err := opts.apiserverBinary(binDir)
	if err != nil {
		return nil, err
	}

	removeStaleDirs(ctx)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	c := &Cluster{Dir: dir, logger: logger}
	if err := c.start(ctx, timeout, etcdBin, apiserverBin, opts); err != nil {
		err = fmt.Errorf("start cluster in %s: %w%s", dir, err, c.logTails())
		if stopErr := c.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, timeout time.Duration, etcdBin, apiserverBin string, opts Options) error {
	started := time.Now()
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("cluster not ready after %s", timeout))
	defer cancel()

	owner := strconv.Itoa(os.Getpid()) + "\n"
	if err := os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(owner), 0o644); err != nil {
		return fmt.Errorf("write owner file: %w", err)
	}
	creds, err := writeCredentials(c.Dir)
	if err != nil {
		return err
	}
	c.ServiceAccountKeyFile = creds.serviceAcctKey

	c.etcd, c.EtcdURL, err = startEtcd(ctx, etcdBin, c.Dir, opts.EtcdFlags)
	if err != nil {
		return err
	}
	c.apiserver, c.Config, err = startAPIServer(ctx, apiserverBin, c.Dir, c.EtcdURL, creds, opts.APIServerFlags)
	if err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return fmt.Errorf("create admin client: %w", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Config.Host, c.Config.BearerToken); err != nil {
		return err
	}
	info, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("read kube-apiserver version: %w", err)
	}
	c.ServerVersion = info.GitVersion
	klog.FromContext(ctx).Info("Cluster started", "host", c.Config.Host, "version", c.ServerVersion, "dir", c.Dir, "duration", time.Since(started).Round(time.Millisecond))
	return nil
}

// ServerCPU is the CPU time kube-apiserver and etcd have used so far, in
// clock ticks (CPUSeconds converts them).
func (c *Cluster) ServerCPU() (apiserver, etcd int64, err error) {
	a, err1 := c.apiserver.Stats()
	e, err2 := c.etcd.Stats()
	return a.CPUTicks, e.CPUTicks, errors.Join(err1, err2)
}

// Stop kills the processes and removes Dir. It may be called more than once.
// Errors are logged; tests that want them use StartT.
func (c *Cluster) Stop() {
	if err := c.stop(); err != nil {
		c.logger.Error(err, "Stop cluster", "dir", c.Dir)
	}
}

func (c *Cluster) stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		// The apiserver first: it would only log etcd's absence.
		for _, p := range []*Process{c.apiserver, c.etcd} {
			if p != nil {
				errs = append(errs, p.Stop(0))
			}
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove cluster directory: %w", err))
		}
		c.stopErr = errors.Join(errs...)
		c.logger.V(1).Info("Cluster stopped", "dir", c.Dir)
	})
	return c.stopErr
}

func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, p := range []*Process{c.etcd, c.apiserver} {
		if p != nil {
			b.WriteString("\n")
			b.WriteString(p.tail())
		}
	}
	return b.String()
}

// StartT starts a cluster for one test and stops it when the test and its
// subtests end, failed or panicked.
func StartT(t testing.TB) *Cluster {
	t.Helper()
	return StartTWithOptions(t, Options{})
}

// StartTWithOptions is StartT with options. Without opts.Logger, progress goes
// to the test log.
func StartTWithOptions(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logger.GetSink() == nil {
		opts.Logger = ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1)))
	}
	c, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// RunMain runs the tests of a package against one shared cluster: call it from
// TestMain. fn receives the cluster before any test runs, typically to store
// it in a variable of the test package. It exits the process with the tests'
// exit code, after stopping the cluster.
//
// Tests sharing a cluster should each work in their own namespace and use
// unique names for cluster-scoped objects (nodes, PVs, CSIDrivers).
func RunMain(m *testing.M, opts Options, fn func(*Cluster)) {
	os.Exit(Run(m, opts, fn))
}

// Run is RunMain without the exit: it returns the tests' exit code, for a
// TestMain with clean-up of its own to do after the cluster is stopped.
func Run(m *testing.M, opts Options, fn func(*Cluster)) int {
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	c, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Stop()
	fn(c)
	return m.Run()
}

func (o Options) binDir() (string, error) {
	if o.BinDir != "" {
		return o.BinDir, nil
	}
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("%w; set %s", err, BinDirEnv)
	}
	return filepath.Join(root, "_output", "bin"), nil
}

func (o Options) apiserverBinary(binDir string) (string, error) {
	if o.APIServerBinary != "" {
		return findBinary(filepath.Dir(o.APIServerBinary), filepath.Base(o.APIServerBinary))
	}
	if bin, err := PrebuiltBinary(APIServerBinaryEnv); bin != "" || err != nil {
		return bin, err
	}
	return findBinary(binDir, "kube-apiserver")
}

// ModuleRoot walks up from the working directory, which go test sets to the
// package directory, to the nearest go.mod: the repository root.
func ModuleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find module root: no go.mod above %s", wd)
		}
	}
}

func findBinary(dir, name string) (string, error) {
	path := filepath.Join(dir, name)
	info, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s binary (build it with hack/build-tools.sh %s): %w", name, name, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", path)
	}
	return path, nil
}

// RestartAPIServer kills kube-apiserver (SIGKILL) and starts
// it again with the same flags on the same port, and returns once it is
// ready: what clients see of an apiserver upgrade or crash. etcd keeps
// running, so every object stays.
func (c *Cluster) RestartAPIServer(ctx context.Context, down time.Duration) error {
	return c.restartAPIServer(ctx, down, nil)
}

// RestartAPIServerCompacted is RestartAPIServer with etcd compacted while
// kube-apiserver is down (CompactEtcd): every client resumes its watches
// from a resourceVersion too old to serve, gets 410 Gone and lists again,
// and what was deleted meanwhile reaches an informer as a tombstone. It
// returns the revision compacted at.
func (c *Cluster) RestartAPIServerCompacted(ctx context.Context, down time.Duration) (int64, error) {
	var rev int64
	err := c.restartAPIServer(ctx, down, func(ctx context.Context) error {
		var err error
		rev, err = c.CompactEtcd(ctx)
		return err
	})
	return rev, err
}

func (c *Cluster) restartAPIServer(ctx context.Context, down time.Duration, whileDown func(context.Context) error) error {
	old := c.apiserver
	if old == nil {
		return errors.New("no kube-apiserver to restart")
	}
	if err := old.Stop(0); err != nil {
		c.logger.V(1).Info("Kube-apiserver stopped with an error", "err", err)
	}
	var downErr error
	if whileDown != nil {
		// Started again all the same: the cluster stays usable.
		downErr = whileDown(ctx)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	var last error
	for attempt := 1; attempt <= 20; attempt++ {
		p, err := startProcess(ctx, c.Dir, "kube-apiserver", old.Cmd.Path, old.Cmd.Args[1:]...)
		if err != nil {
			return err
		}
		if last = waitForReadyz(ctx, p, c.Config); last == nil {
			c.apiserver = p
			return downErr
		}
		// The port of the old process may not be free yet.
		_ = p.Stop(0)
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("restart kube-apiserver: %w", last)
}
