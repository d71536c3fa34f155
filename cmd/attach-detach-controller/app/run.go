package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/guard"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/migration"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
)

// Retry policy after a failed operation, as upstream: 500ms doubling, capped
// at 2m2s, reset on success.
const (
	// statusQPSPerWorker sets how many node status writers run (see
	// statusWorkers).
	statusQPSPerWorker = 40

	// scrapeInterval: scrapes within it share one gather of the metrics.
	scrapeInterval = 2 * time.Second

	retryBase = 500 * time.Millisecond
	retryMax  = 2*time.Minute + 2*time.Second
)

// Run runs the controller until ctx is cancelled; with leader election, only
// while it holds the lease. It returns once everything has stopped and the
// lease is released. It serves no client-go request or leader election
// metrics: those hook into client-go process-wide, which only the command
// does (RunProcess), before any request is made.
func Run(ctx context.Context, o *Options) error {
	return run(ctx, o, newRegistry())
}

// RunProcess is Run for the process: client-go's request and leader election
// metrics are installed first, then served with the rest.
func RunProcess(ctx context.Context, o *Options) error {
	reg := newRegistry()
	clientMetrics, err := metrics.NewClientMetrics(reg)
	if err != nil {
		return fmt.Errorf("register client metrics: %w", err)
	}
	clientMetrics.Install()
	leaderMetrics, err := metrics.NewLeaderMetrics(reg)
	if err != nil {
		return fmt.Errorf("register leader election metrics: %w", err)
	}
	leaderMetrics.Install()
	if o.LeaderElection.LeaderElect {
		// A standby says so (0) until it leads.
		leaderMetrics.Standby(o.LeaderElection.ResourceName)
	}
	return run(ctx, o, reg)
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func run(ctx context.Context, o *Options, reg *prometheus.Registry) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting attach-detach-controller", "version", Version)
	config, err := restConfig(o)
	if err != nil {
		return err
	}

	// The controller's own clients; leader election has its own (runLeading).
	controllerConfig := config
	if o.Shadow {
		// Shadow mode writes nothing: a request that is not a read fails
		// before it leaves the process.
		readOnly, err := shadow.NewReadOnly(logger, reg)
		if err != nil {
			return err
		}
		controllerConfig = readOnly.Wrap(config)
		logger.Info("Shadow mode: comparing with the cluster, writing nothing", "gracePeriod", o.ShadowGracePeriod)
	}
	// Its budget (--kube-api-qps, --kube-api-burst) serves a move's
	// requests first, then new attaches', then the rest (pkg/budget).
	// The event broadcaster and the dynamic client keep budgets of their
	// own, as before (newController).
	clientConfig := rest.CopyConfig(controllerConfig)
	clientConfig.RateLimiter = budget.New(o.QPS, o.Burst)
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(clientConfig, "attach-detach-controller"))
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	var healthz *leaderelection.HealthzAdaptor
	var ready atomic.Bool
	if o.LeaderElection.LeaderElect {
		healthz = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	var current atomic.Pointer[controller.Controller]
	e := newEndpoints(reg, healthz, &ready, o.LeaderElection.LeaderElect, &current)
	stopSecure, err := serveSecure(ctx, o, e)
	if err != nil {
		return err
	}
	defer stopSecure()
	stopHTTP, err := serveHTTP(ctx, o.HTTPEndpoint, e)
	if err != nil {
		return err
	}
	defer stopHTTP()
	// Memory a burst of work left behind goes back to the system once the
	// controller is quiet again.
	releaseCtx, stopReleaser := context.WithCancel(ctx)
	released := make(chan struct{})
	go func() {
		defer close(released)
		newReleaser().Run(releaseCtx)
	}()
	defer func() {
		stopReleaser()
		<-released
	}()

	// ctx cancelled (SIGTERM) is a graceful stop: the controller hands its
	// volumes over, still holding the Lease, before it returns. Its own
	// context (runCtx) ends it at once: when the Lease is lost.
	runController := func(runCtx, stop context.Context) error {
		ctx := runCtx
		g, err := newGuard(o, reg)
		if err != nil {
			return err
		}
		if g != nil {
			defer g.Unregister()
		}
		c, err := newController(ctx, o, controllerConfig, client, reg, g)
		if err != nil {
			return err
		}
		current.Store(c.c)
		defer current.Store(nil)
		if g != nil {
			stopGuard := runGuard(ctx, g, client)
			defer stopGuard()
		}
		return c.Run(ctx, stop, &ready)
	}
	if !o.LeaderElection.LeaderElect {
		return runController(context.WithoutCancel(ctx), ctx)
	}
	return runLeading(ctx, o, config, healthz, runController)
}

// newGuard returns the watch for another attach/detach controller
// (pkg/guard), fed by the controller's informers and its own watch on
// events; nil when turned off.
func newGuard(o *Options, reg prometheus.Registerer) (*guard.Guard, error) {
	// In shadow mode the other writer is expected: it is what is compared.
	if o.OtherWriterCheckPeriod == 0 || o.Shadow {
		return nil, nil
	}
	// The API server names a writer after its user agent's first word: the
	// command's name (rest.AddUserAgent keeps it first).
	self, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/")
	return guard.New(guard.Config{
		Self:       []string{self},
		Since:      time.Now().Add(-time.Second),
		Period:     o.OtherWriterCheckPeriod,
		Registerer: reg,
	})
}

// runGuard reports what the guard finds while the controller runs, and
// watches the events of attach/detach controllers for it; the returned
// function stops both and waits for them.
func runGuard(ctx context.Context, g *guard.Guard, client kubernetes.Interface) func() {
	guardCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { g.Run(guardCtx) })
	wg.Go(func() { g.WatchEvents(guardCtx, client) })
	return func() {
		cancel()
		wg.Wait()
	}
}

func restConfig(o *Options) (*rest.Config, error) {
	var config *rest.Config
	var err error
	if o.Kubeconfig == "" {
		config, err = rest.InClusterConfig()
	} else {
		config, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("load client configuration: %w", err)
	}
	config.QPS = o.QPS
	config.Burst = o.Burst
	// Protobuf, as kube-controller-manager asks for it: the initial lists of
	// a restart (every pod, PV, claim, node and VolumeAttachment) decode
	// several times faster than JSON. The dynamic client (the CSINodeInfo
	// CRD's objects) sets JSON for itself.
	config.ContentType = runtime.ContentTypeProtobuf
	// No gzip: the kube-apiserver compresses a large answer (the initial
	// lists, streamed as watch events) at a cost in its CPU several times
	// what the controller spends decompressing it, for bandwidth a control
	// plane rarely lacks; at 100,000 volumes the restart waits for it.
	config.DisableCompression = true
	config.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return config, nil
}

// controllerRun is the controller with its event broadcaster, so that both
// stop together.
type controllerRun struct {
	c           *controller.Controller
	broadcaster record.EventBroadcaster
}

func (r *controllerRun) Run(ctx, stop context.Context, ready *atomic.Bool) error {
	defer r.broadcaster.Shutdown()
	return r.c.RunGraceful(ctx, stop, func() { ready.Store(true) })
}

func newController(ctx context.Context, o *Options, config *rest.Config, client kubernetes.Interface, reg prometheus.Registerer,
	g *guard.Guard) (*controllerRun, error) {
	logger := klog.FromContext(ctx)
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("create dynamic client: %w", err)
	}
	completed, err := migration.CompletedMigrations(o.CSIMigration)
	if err != nil {
		return nil, fmt.Errorf("--csi-migration: %w", err)
	}
	logger.Info("CSI migration policy", "policy", o.CSIMigration, "migratedOnEveryNode", completed)
	broadcaster, err := newBroadcaster(ctx, o, config)
	if err != nil {
		return nil, err
	}
	// The source kube-controller-manager's attachdetach controller posts
	// as: users' tooling selects the events by it.
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: guard.EventSource})
	var observer controller.Observer
	var anotherController func() string
	if g != nil {
		g.SetRecorder(recorder)
		observer, anotherController = g, g.Summary
	}
	m := metrics.New()
	if err := m.Register(reg); err != nil {
		broadcaster.Shutdown()
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	var tracker *shadow.Tracker
	if o.Shadow {
		if tracker, err = shadow.NewTracker(o.ShadowGracePeriod, time.Now(), reg); err != nil {
			broadcaster.Shutdown()
			return nil, err
		}
	}
	c, err := controller.New(controller.Config{
		Client:              client,
		Dynamic:             dyn,
		CompletedMigrations: completed,
		Recorder:            recorder,
		Metrics:             m,
		Registerer:          reg,
		Reconciler: reconciler.Config{
			MaxWaitForUnmount:            o.MaxWaitForUnmount,
			MaxWaitForUnmountDeletedNode: o.MaxWaitForUnmountDeletedNode,
			DisableForceDetachOnTimeout:  o.DisableForceDetachOnTimeout,
			UnhealthyZoneThreshold:       o.zoneThreshold(),
			UnhealthyZoneMinNodes:        o.UnhealthyZoneMinNodes,
		},
		InTree:            intree.Builtin(),
		Observer:          observer,
		AnotherController: anotherController,
		Shadow:            tracker,
		Workers:           o.Workers,
		StatusWorkers:     statusWorkers(o.QPS),
		StatusHold:        statusHold,
		SyncPeriod:        syncPeriod(o),
		// With a graceful stop (stop done, ctx not), the controller hands
		// its volumes over for up to this long.
		HandoffTimeout: o.HandoffTimeout,
		RateLimiter: func() workqueue.TypedRateLimiter[cache.Key] {
			return workqueue.NewTypedItemExponentialFailureRateLimiter[cache.Key](retryBase, retryMax)
		},
		NodeRateLimiter: func() workqueue.TypedRateLimiter[string] {
			return workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax)
		},
	})
	if err != nil {
		broadcaster.Shutdown()
		return nil, err
	}
	return &controllerRun{c: c, broadcaster: broadcaster}, nil
}

// newBroadcaster returns the event broadcaster: posting to the API through
// a client of its own, or, in shadow mode, only logging (at level 4) the
// events the controller would post.
func newBroadcaster(ctx context.Context, o *Options, config *rest.Config) (record.EventBroadcaster, error) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	if o.Shadow {
		broadcaster.StartStructuredLogging(4)
		return broadcaster, nil
	}
	// Events have a client, and so a rate limiter, of their own: posting
	// them must not slow attaches down.
	// A budget of its own, whatever config carries (rest.CopyConfig
	// copies a RateLimiter's pointer): events take no token from the
	// controller's requests.
	config = rest.CopyConfig(config)
	config.RateLimiter = nil
	eventClient, err := kubernetes.NewForConfig(rest.AddUserAgent(config, "attach-detach-controller-events"))
	if err != nil {
		broadcaster.Shutdown()
		return nil, fmt.Errorf("create event client: %w", err)
	}
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: eventClient.CoreV1().Events("")})
	return broadcaster, nil
}

func syncPeriod(o *Options) time.Duration {
	if o.DisableReconcileSync {
		return 0
	}
	return o.ReconcileSyncPeriod
}

// runLeading runs the controller while holding the lease. On ctx
// cancellation the controller stops first, then the lease is released, so
// a successor never overlaps with a controller still acting.
func runLeading(ctx context.Context, o *Options, config *rest.Config, healthz *leaderelection.HealthzAdaptor,
	run func(runCtx, stop context.Context) error) error {
	logger := klog.FromContext(ctx)
	// A separate client, so that controller traffic can't starve renewals.
	leClient, err := kubernetes.NewForConfig(rest.AddUserAgent(config, "attach-detach-controller-leader-election"))
	if err != nil {
		return fmt.Errorf("create leader election client: %w", err)
	}
	id := hostname() + "_" + randomSuffix()
	lock, err := resourcelock.New(o.LeaderElection.ResourceLock, o.LeaderElection.ResourceNamespace, o.LeaderElection.ResourceName,
		leClient.CoreV1(), leClient.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("create leader election lock: %w", err)
	}
	electorCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	var leading atomic.Bool
	var runErr error
	done := make(chan struct{})
	// Closed when the controller run by OnStartedLeading has returned:
	// client-go's Run returns as soon as renewals stop, without waiting for
	// that callback.
	runDone := make(chan struct{})
	go func() {
		// Not leading when asked to stop: stop campaigning at once.
		select {
		case <-ctx.Done():
			if !leading.Load() {
				stopElector()
			}
		case <-done:
		}
	}()
	le, err := newElector(healthz, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.LeaderElection.LeaseDuration.Duration,
		RenewDeadline:   o.LeaderElection.RenewDeadline.Duration,
		RetryPeriod:     o.LeaderElection.RetryPeriod.Duration,
		ReleaseOnCancel: true,
		Name:            o.LeaderElection.ResourceName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leCtx context.Context) {
				defer close(runDone)
				leading.Store(true)
				logger.Info("Became leader", "identity", id)
				// Not cancelled by ctx: a graceful stop (ctx done) hands the
				// volumes over while the Lease is still renewed.
				runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
				go func() {
					select {
					case <-leCtx.Done():
					case <-runCtx.Done():
					}
					cancel()
				}()
				runErr = run(runCtx, ctx)
				if ctx.Err() == nil && leCtx.Err() != nil {
					// The Lease could not be renewed: another replica may lead
					// now. Exit non-zero at once, as kube-controller-manager
					// does, so that the pod restarts as a standby.
					runErr = errLeaseLost
				} else if ctx.Err() == nil && runErr == nil {
					runErr = errLeaseLost
				}
				cancel()
				stopElector()
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "identity", id)
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica leads", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(electorCtx)
	close(done)
	// Run returns without its context cancelled only when renewals failed,
	// so the controller was started: wait for it to stop.
	if electorCtx.Err() == nil || leading.Load() {
		<-runDone
	}
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		logger.Error(runErr, "Exiting", "identity", id)
		return runErr
	}
	logger.Info("Exiting")
	return nil
}

// endpoints are the handlers served on the secure port and, without
// /explain, on --http-endpoint.
type endpoints struct {
	metrics http.Handler
	healthz http.HandlerFunc
	readyz  http.HandlerFunc
	explain http.HandlerFunc
	shadow  http.HandlerFunc
}

// newElector returns the leader elector of cfg with healthz (when not nil)
// as its watchdog: /healthz fails when this replica leads but has not
// renewed the Lease for too long. client-go wires the watchdog only in
// RunOrDie.
func newElector(healthz *leaderelection.HealthzAdaptor, cfg leaderelection.LeaderElectionConfig) (*leaderelection.LeaderElector, error) {
	cfg.WatchDog = healthz
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return nil, err
	}
	if healthz != nil {
		healthz.SetLeaderElection(le)
	}
	return le, nil
}

func newEndpoints(reg *prometheus.Registry, healthz *leaderelection.HealthzAdaptor, ready *atomic.Bool, leaderElect bool,
	current *atomic.Pointer[controller.Controller]) *endpoints {
	return &endpoints{
		// Scrapes share one gather per interval (it reads the caches under
		// their locks), at most 4 are served at once, and one that takes
		// longer than 20s is cut short rather than left to pile up.
		metrics: promhttp.HandlerFor(metrics.NewCachedGatherer(reg, scrapeInterval),
			promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: 20 * time.Second}),
		healthz: func(w http.ResponseWriter, r *http.Request) {
			if healthz != nil {
				if err := healthz.Check(r); err != nil {
					http.Error(w, "leader election: "+err.Error(), http.StatusInternalServerError)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		},
		readyz: func(w http.ResponseWriter, _ *http.Request) {
			// A standby replica is ready: it is ready to take over. The leader is
			// ready once it has rebuilt its state.
			if !leaderElect && !ready.Load() {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		},
		explain: leaderOnly(current, (*controller.Controller).ServeHTTP),
		shadow:  leaderOnly(current, (*controller.Controller).ServeShadow),
	}
}

// mux serves the endpoints; /explain and /shadow only when explain is set,
// since they tell about pods of every namespace and must stay behind
// authorization.
func (e *endpoints) mux(explain bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.metrics)
	mux.HandleFunc("/healthz", e.healthz)
	mux.HandleFunc("/livez", e.healthz)
	mux.HandleFunc("/readyz", e.readyz)
	if explain {
		mux.HandleFunc("/explain", e.explain)
		mux.HandleFunc("/shadow", e.shadow)
	}
	return mux
}

// serveSecure serves the endpoints over HTTPS behind delegated
// authentication and authorization (pkg/server) until ctx is cancelled.
func serveSecure(ctx context.Context, o *Options, e *endpoints) (func(), error) {
	if o.Serving == nil {
		return func() {}, nil
	}
	return o.Serving.Serve(ctx, o.Kubeconfig, e.mux(true))
}

// serveHTTP serves /metrics, /healthz, /livez and /readyz in plain HTTP
// without authentication, for local use; never /explain nor /shadow.
func serveHTTP(ctx context.Context, addr string, e *endpoints) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-endpoint %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           http.TimeoutHandler(e.mux(false), 30*time.Second, "request timed out"),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "HTTP endpoint failed")
		}
	}()
	klog.FromContext(ctx).Info("Serving HTTP", "address", ln.Addr().String())
	return func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}, nil
}

// leaderOnly serves h of the running controller; a replica that does not
// lead has none and says so.
func leaderOnly(current *atomic.Pointer[controller.Controller],
	h func(*controller.Controller, http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := current.Load()
		if c == nil {
			http.Error(w, "not leading: ask the leader", http.StatusServiceUnavailable)
			return
		}
		h(c, w, r)
	}
}

// statusHold is how long a node status write that only adds volumes waits
// for the other attaches under way on its node, so that one write reports
// them together (a node's pods are often scheduled together): about the
// time a node's attaches take to complete at the default API budget, and
// short beside the time kubelet takes to mount what it reports.
const statusHold = time.Second

// statusWorkers is how many node status writers run: one per
// statusQPSPerWorker of the API budget, 1 to 10. A write carries every change
// of its node, so at the default budget (20) one writer suffices and takes a
// small share of it while attaches are being created, its writes batching
// more; but one writer sends one patch at a time, 20-40 a second at the
// latencies of a busy API server, which a budget of 200 on 10,000 nodes
// outruns (bench/results/2026-11-23-huge-qps200-burst300-ours.md).
func statusWorkers(qps float32) int {
	return max(1, min(10, int(qps/statusQPSPerWorker)))
}
