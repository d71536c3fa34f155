package deploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// reportWithin bounds the time from kube-controller-manager's first
	// attach event to the guard's report.
	reportWithin = 10 * time.Second
	// soakEnv, a duration (e.g. 5m), makes TestGuardQuietBesideKubeControllerManager
	// run its workload that long (make test-guard-soak); by default it runs
	// quietWorkload.
	soakEnv       = "ADC_GUARD_SOAK"
	quietWorkload = 20 * time.Second
	// attachSource is the event source of both attach/detach controllers.
	attachSource = "attachdetach-controller"
)

// TestGuardSeesKubeControllerManagerAgreeing runs kube-controller-manager's
// attachdetach controller beside this one while both agree: this
// controller, already running, attaches the pods' volumes; kube-controller-
// manager finds each VolumeAttachment made (its create fails with
// AlreadyExists) and its node status write changes nothing, and it posts
// SuccessfulAttachVolume on each pod. From that event alone the guard
// reports it, with this controller's check period at its default (1m): the
// metric, a Warning event on the pod, /explain and the log line, within
// reportWithin of kube-controller-manager's first event.
func TestGuardSeesKubeControllerManagerAgreeing(t *testing.T) {
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	applySecureRBAC(t, r)
	s := newScene(t, "agree", "")
	vols := []volume{s.volume("one", "handle-one"), s.volume("two", "handle-two"), s.volume("three", "handle-three")}
	// kube-controller-manager resolves a pod's claim from its initial list
	// (scene.createClaim).
	for _, v := range vols {
		s.createClaim(v)
	}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ours := startController(t, r, kubeconfig, []string{fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1"})
	defer stopController(t, ours)
	waitStarted(t, ours)
	secure := fmt.Sprintf("https://127.0.0.1:%d", port)

	// This controller attaches the first volume alone: the two agree on
	// what exists before kube-controller-manager comes.
	s.startPod(vols[0])
	s.waitAttached(vols[0])
	s.waitReported(vols[0], true)

	first := watchFirstEvent(t, s, "kube-controller-manager", "SuccessfulAttachVolume")
	kcm := startKubeControllerManager(t)
	defer kcm.stop(t)
	for _, v := range vols[1:] {
		s.startPod(v)
	}
	var at time.Time
	var kcmEvent *v1.Event
	select {
	case ev := <-first:
		at, kcmEvent = ev.at, ev.event
	case <-time.After(waitTimeout):
		t.Fatalf("no SuccessfulAttachVolume of kube-controller-manager's within %s", waitTimeout)
	}
	t.Logf("kube-controller-manager's first SuccessfulAttachVolume: on pod %s, %q", kcmEvent.InvolvedObject.Name, kcmEvent.Message)

	// The report, each part timed from that event.
	var metricAfter, eventAfter, explainAfter time.Duration
	var others float64
	framework.Eventually(t, reportWithin-time.Since(at), func() (bool, error) {
		if metricAfter == 0 {
			if m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics"); err == nil && m.Sum(otherWriters, map[string]string{"resource": "events"}) > 0 {
				metricAfter = time.Since(at)
				others = m.Sum(otherWriters, nil) - m.Sum(otherWriters, map[string]string{"resource": "events"})
			}
		}
		if eventAfter == 0 {
			warnings, err := anotherControllerWarnings(s, s.ns)
			if err != nil {
				return false, err
			}
			for _, e := range warnings {
				if e.InvolvedObject.Kind == "Pod" && strings.Contains(e.Message, `"kube-controller-manager"`) &&
					strings.Contains(e.Message, "SuccessfulAttachVolume") && strings.Contains(e.Message, "--controllers=*,-attachdetach") {
					eventAfter = time.Since(at)
				}
			}
		}
		if explainAfter == 0 {
			if body, ok := tryGetSecure(s.ctx, secure, "/explain?pod="+s.ns+"/"+vols[0].name); ok &&
				strings.Contains(body, `"anotherController"`) && strings.Contains(body, `kube-controller-manager`) {
				explainAfter = time.Since(at)
			}
		}
		return metricAfter > 0 && eventAfter > 0 && explainAfter > 0, nil
	}, "the metric, a Warning event on a pod and /explain naming kube-controller-manager within %s of its first event", reportWithin)
	// From the test's receipt of the event (the guard may see it first),
	// and from its write as the API server recorded it (to the second,
	// rounded down: an upper bound).
	var written time.Time
	for _, m := range kcmEvent.ManagedFields {
		if m.Manager == "kube-controller-manager" && m.Time != nil {
			written = m.Time.Time
		}
	}
	sinceWrite := at.Sub(written)
	t.Logf("reported after kube-controller-manager's first SuccessfulAttachVolume: metric %.1fs, Warning event %.1fs, /explain %.1fs after the test saw it; at most %.1fs, %.1fs, %.1fs after its write (objects of other resources written by another manager at the metric: %v)",
		metricAfter.Seconds(), eventAfter.Seconds(), explainAfter.Seconds(),
		(metricAfter + sinceWrite).Seconds(), (eventAfter + sinceWrite).Seconds(), (explainAfter + sinceWrite).Seconds(), others)
	if d := max(metricAfter, eventAfter, explainAfter) + sinceWrite; d > reportWithin {
		t.Errorf("reported %.1fs after the event's write, want within %s", d.Seconds(), reportWithin)
	}
	// Both attached every volume, as they agree; who wrote what, as the
	// API server recorded it.
	for _, v := range vols {
		va := s.waitAttached(v)
		s.waitReported(v, true)
		for _, e := range va.ManagedFields {
			if e.Subresource == "" {
				t.Logf("VolumeAttachment of %s: spec written by %q", v.name, e.Manager)
			}
		}
	}
	if n, err := eventsBy(s, s.ns, "kube-controller-manager", time.Time{}, fields.Set{"source": attachSource, "reason": "SuccessfulAttachVolume"}.AsSelector()); err == nil {
		t.Logf("kube-controller-manager posted SuccessfulAttachVolume on %d pods", n)
	}
	if out := ours.Output(); len(logLines(out, "Another attach/detach controller writes beside this one", `resource="events"`, "kube-controller-manager")) == 0 {
		t.Errorf("no log line naming kube-controller-manager's events")
	}
}

// TestGuardQuietBesideKubeControllerManager runs kube-controller-manager as
// a cluster that cut over runs it, every controller but attachdetach
// (--controllers=*,-attachdetach), beside this controller through a
// workload of attaches and detaches: the guard reports nothing, though
// kube-controller-manager posts events (its node controller's) and this
// controller posts its own attach events as attachdetach-controller.
// ADC_GUARD_SOAK=5m runs the workload 5 minutes (make test-guard-soak).
func TestGuardQuietBesideKubeControllerManager(t *testing.T) {
	d := quietWorkload
	if v := os.Getenv(soakEnv); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s=%q: %v", soakEnv, v, err)
		}
	}
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	s := newScene(t, "quiet", "")
	start := time.Now()
	ours := startController(t, r, kubeconfig, []string{"--other-writer-check-period=1s"})
	defer stopController(t, ours)
	waitStarted(t, ours)
	kcm := startKubeControllerManagerWithout(t)
	defer kcm.stop(t)
	// It runs its other controllers, and posts as kube-controller-manager.
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		n, err := eventsBy(s, "", "kube-controller-manager", start, fields.OneTermEqualSelector("involvedObject.name", s.node))
		return n > 0, err
	}, "an event of kube-controller-manager's about node %s", s.node)

	// The metric stays 0 all along, checked in the background.
	var mu sync.Mutex
	var reported []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics")
			if err == nil && m.Sum(otherWriters, nil) != 0 {
				mu.Lock()
				reported = append(reported, fmt.Sprintf("%s = %v at %s", otherWriters, m.Sum(otherWriters, nil), time.Since(start).Round(time.Second)))
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})

	// The workload: pods come, their volumes attach; older ones go, their
	// volumes detach; at most three run at once.
	var live []volume
	i := 0
	for end := time.Now().Add(d); time.Now().Before(end); i++ {
		v := s.volume(fmt.Sprintf("v%d", i), fmt.Sprintf("handle-%d", i))
		s.createPod(v)
		s.waitAttached(v)
		s.waitReported(v, true)
		live = append(live, v)
		if len(live) > 3 {
			s.deletePod(live[0])
			s.waitDetached(live[0])
			s.waitReported(live[0], false)
			live = live[1:]
		}
	}
	close(stop)
	wg.Wait()
	// And the guard's checks (one a second) after the workload's last
	// events.
	framework.Consistently(t, 3*time.Second, func() error {
		m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics")
		if err != nil {
			return err
		}
		if len(m.Select(otherWriters, map[string]string{"resource": "events"})) != 1 {
			return fmt.Errorf("%s{resource=\"events\"} not served", otherWriters)
		}
		if n := m.Sum(otherWriters, nil); n != 0 {
			return fmt.Errorf("%s = %v", otherWriters, n)
		}
		return nil
	}, "%s at 0 after the workload", otherWriters)

	ownEvents, err := eventsBy(s, s.ns, "attach-detach-controller", start, fields.OneTermEqualSelector("source", attachSource))
	if err != nil {
		t.Fatal(err)
	}
	kcmEvents, err := eventsBy(s, "", "kube-controller-manager", start, fields.Everything())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s of workload: %d attaches, %d events of this controller's as %s, %d events of kube-controller-manager's since it started",
		d, i, ownEvents, attachSource, kcmEvents)
	if ownEvents < i {
		t.Errorf("%d events of this controller's as %s for %d attaches: the guard's filter was not put to the test", ownEvents, attachSource, i)
	}
	mu.Lock()
	for _, r := range reported {
		t.Errorf("reported beside kube-controller-manager --controllers=*,-attachdetach: %s", r)
	}
	mu.Unlock()
	warnings, err := anotherControllerWarnings(s, "")
	if err != nil {
		t.Fatal(err)
	}
	// The guard's Warning goes on a pod, a node or a VolumeAttachment
	// written: this test's, not a test's before.
	mine := map[string]bool{s.node: true}
	for j := range i {
		mine[s.volume(fmt.Sprintf("v%d", j), fmt.Sprintf("handle-%d", j)).attachment] = true
	}
	for _, e := range warnings {
		if e.Namespace == s.ns || mine[e.InvolvedObject.Name] {
			t.Errorf("Warning event %s/%s: %s", e.Namespace, e.Name, e.Message)
		}
	}
	if lines := logLines(ours.Output(), "Another attach/detach controller writes beside this one"); len(lines) > 0 {
		t.Errorf("the guard logged another controller: %s", lines[0])
	}
	// Quiet because it watched, not because its watch failed.
	if lines := logLines(ours.Output(), "Watching the events of attach/detach controllers; retrying"); len(lines) > 0 {
		t.Errorf("the guard's watch of events failed: %s", lines[0])
	}
	t.Logf("false reports: 0 over %s", time.Since(start).Round(time.Second))
}

// startKubeControllerManagerWithout starts kube-controller-manager as a
// cluster that cut over runs it: --controllers=*,-attachdetach. It returns
// once it has logged its attachdetach controller disabled.
func startKubeControllerManagerWithout(t *testing.T) *kubeControllerManager {
	t.Helper()
	p := framework.StartProcess(t, tools.kubeControllerManager,
		framework.KubeControllerManagerArgsWith(cluster.Kubeconfig, t.TempDir(), "*,-attachdetach")...)
	framework.Eventually(t, startTimeout, func() (bool, error) {
		select {
		case <-p.Done():
			return false, fmt.Errorf("kube-controller-manager exited: %v\n%s", p.Cmd.ProcessState, p.Output())
		default:
		}
		return strings.Contains(p.Output(), `"Warning: controller is disabled" controller="persistentvolume-attach-detach-controller"`), nil
	}, "kube-controller-manager started without its attachdetach controller")
	return &kubeControllerManager{p: p}
}

// firstEvent is an event as the test's watch received it.
type firstEvent struct {
	event *v1.Event
	at    time.Time
}

// watchFirstEvent sends, once, the first event of reason in the scene's
// namespace written by manager, and when the test received it.
func watchFirstEvent(t *testing.T, s *scene, manager, reason string) <-chan firstEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(s.ctx)
	w, err := s.client.CoreV1().Events(s.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"source": attachSource, "reason": reason}.String()})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan firstEvent, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			e, ok := ev.Object.(*v1.Event)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if writtenBy(e, manager) {
				out <- firstEvent{event: e, at: time.Now()}
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return out
}

func writtenBy(e *v1.Event, manager string) bool {
	for _, m := range e.ManagedFields {
		if m.Manager == manager {
			return true
		}
	}
	return false
}

// eventsBy counts the events of namespace ns (all: "") selected by
// selector that manager wrote since since.
func eventsBy(s *scene, ns, manager string, since time.Time, selector fields.Selector) (int, error) {
	list, err := s.client.CoreV1().Events(ns).List(s.ctx, metav1.ListOptions{FieldSelector: selector.String()})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range list.Items {
		for _, m := range e.ManagedFields {
			if m.Manager == manager && m.Time != nil && !m.Time.Time.Before(since.Truncate(time.Second)) {
				n++
				break
			}
		}
	}
	return n, nil
}

// anotherControllerWarnings lists the guard's Warning events in namespace
// ns (all: "").
func anotherControllerWarnings(s *scene, ns string) ([]v1.Event, error) {
	list, err := s.client.CoreV1().Events(ns).List(s.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"reason": "AnotherAttachDetachController", "type": v1.EventTypeWarning}.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// tryGetSecure is getSecure once: the body of a 200, or false.
func tryGetSecure(ctx context.Context, base, path string) (string, bool) {
	client := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed by design
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return "", false
	}
	req.Header.Set("Authorization", "Bearer "+cluster.Config.BearerToken)
	resp, err := client.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err == nil && resp.StatusCode == http.StatusOK
}
