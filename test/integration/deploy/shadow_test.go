package deploy

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	shadowOpen    = "attachdetach_controller_shadow_disagreements"
	shadowOpened  = "attachdetach_controller_shadow_disagreements_total"
	shadowRefused = "attachdetach_controller_shadow_refused_writes_total"
	// shadowGrace is the test's --shadow-grace-period: longer than
	// kube-controller-manager takes to act on a loaded machine.
	shadowGrace = 10 * time.Second
	ebsDriver   = "ebs.csi.aws.com"
)

// shadowSummary is the part of /shadow the test reads.
type shadowSummary struct {
	Open   map[string]int `json:"open"`
	Opened map[string]int `json:"opened"`
	Oldest []struct {
		Kind    string   `json:"kind"`
		Volume  string   `json:"volume"`
		Node    string   `json:"node"`
		Pods    []string `json:"pods"`
		Ours    string   `json:"ours"`
		Cluster string   `json:"cluster"`
	} `json:"oldestOpen"`
	Closed []struct {
		Kind   string `json:"kind"`
		Volume string `json:"volume"`
	} `json:"recentlyClosed"`
}

// TestShadowBesideKubeControllerManager runs the real kube-controller-manager
// (its attachdetach controller only) and this controller in shadow mode, as
// manifests/overlays/shadow deploys it, on one workload:
//
//   - CSI volumes attached and detached: both agree, nothing is reported;
//   - an in-tree awsElasticBlockStore volume on a node without a CSINode:
//     kube-controller-manager v1.37 attaches it through ebs.csi.aws.com at
//     once (its migration is complete upstream), this controller
//     (--csi-migration=per-node) waits for the node's CSINode: reported as
//     would-not-attach until the CSINode comes;
//   - a volume still mounted on a node that goes NotReady, whose pod is
//     deleted: kube-controller-manager waits its fixed 6 minutes, this
//     controller (--max-wait-for-unmount=10s) would force the detach:
//     reported as would-detach.
//
// The API server's audit log shows that the shadow wrote nothing but its
// Lease.
func TestShadowBesideKubeControllerManager(t *testing.T) {
	base := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, base)
	r := renderDir(t, shadowKustomization)
	applyShadowRBAC(t, r)
	if v, _ := flagValue(r.args(t), "shadow"); v != "" {
		t.Fatalf("--shadow=%s in the overlay, want the bare flag", v)
	}
	if !slices.Contains(r.args(t), "--shadow") {
		t.Fatalf("the shadow overlay's arguments %v lack --shadow", r.args(t))
	}

	s := newScene(t, "shadow", "")
	sick := s.node + "-sick"
	if _, err := framework.CreateNode(s.ctx, s.client, framework.Node(sick)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(t.Context(), sick, metav1.DeleteOptions{}) })
	framework.StartAttacher(t, s.client, framework.AttacherOptions{Drivers: []string{ebsDriver}})

	// Every claim before kube-controller-manager starts (scene.createClaim).
	one, two := s.volume("one", "handle-one"), s.volume("two", "handle-two")
	s.createClaim(one)
	s.createClaim(two)
	ebsHandle := "vol-" + s.ns
	ebs := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: ebsHandle}}
	if _, _, err := framework.CreateBoundPVC(s.ctx, s.client, s.ns, "ebs", ebs); err != nil {
		t.Fatal(err)
	}
	three := s.volume("three", "handle-three")
	s.createClaim(three)

	kcm := startKubeControllerManager(t)
	defer kcm.stop(t)
	offset := auditOffset(t)
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ours := startController(t, r, kubeconfig, []string{
		"--shadow-grace-period=" + shadowGrace.String(),
		"--max-wait-for-unmount=10s",
		fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1",
	})
	defer stopController(t, ours)
	waitStarted(t, ours)
	secure := fmt.Sprintf("https://127.0.0.1:%d", port)

	// Agreement: CSI volumes attached, one detached again.
	s.startPod(one)
	s.startPod(two)
	s.waitAttached(one)
	s.waitAttached(two)
	s.waitReported(one, true)
	s.waitReported(two, true)
	s.deletePod(two)
	s.waitDetached(two)

	// A known difference: an EBS volume on a node without a CSINode.
	if _, err := framework.CreatePod(s.ctx, s.client, s.ns, "ebs", s.node, "ebs"); err != nil {
		t.Fatal(err)
	}
	ebsVolume := volume{name: "ebs", handle: ebsHandle, node: s.node,
		unique:     framework.CSIVolumeName(ebsDriver, ebsHandle),
		attachment: framework.VolumeAttachmentName(ebsHandle, ebsDriver, s.node)}
	s.waitAttached(ebsVolume)
	waitShadowMetric(t, ours, "would-not-attach", 1)

	// A known difference: a mounted volume on a node gone NotReady.
	three.node = sick
	three.attachment = framework.VolumeAttachmentName(three.handle, s.driver, sick)
	s.startPod(three)
	s.waitAttached(three)
	s.waitReported(three, true)
	s.setInUse(sick, three)
	if err := framework.SetNodeReady(s.ctx, s.client, sick, false); err != nil {
		t.Fatal(err)
	}
	// Both controllers' node informers see the mount and the NotReady node
	// before the pod goes; kube-controller-manager keeps the volume.
	framework.Consistently(t, 2*time.Second, func() error { return stillAttached(s, three) },
		"kube-controller-manager keeps %s attached", three.name)
	s.deletePod(three)
	waitShadowMetric(t, ours, "would-detach", 1)
	if err := stillAttached(s, three); err != nil {
		t.Fatalf("kube-controller-manager detached %s before its 6 minutes: %v", three.name, err)
	}

	// The report.
	sum := getShadowSummary(t, secure)
	t.Logf("shadow report: open %v, opened %v", sum.Open, sum.Opened)
	for _, d := range sum.Oldest {
		t.Logf("open disagreement: %s %s on %s, pods %v: ours %q, cluster %q", d.Kind, d.Volume, d.Node, d.Pods, d.Ours, d.Cluster)
	}
	wantOpen := map[string]int{"would-attach": 0, "would-detach": 1, "would-not-attach": 1, "would-wait-for-unmount": 0}
	for kind, n := range wantOpen {
		if sum.Open[kind] != n || sum.Opened[kind] != n {
			t.Errorf("/shadow: %s open %d, opened %d, want %d", kind, sum.Open[kind], sum.Opened[kind], n)
		}
	}
	var sawEBS, sawThree bool
	for _, d := range sum.Oldest {
		switch {
		case d.Kind == "would-not-attach" && d.Volume == "kubernetes.io/aws-ebs/"+ebsHandle && d.Node == s.node:
			sawEBS = true
			if !slices.Contains(d.Pods, s.ns+"/ebs") || !strings.Contains(d.Ours, "CSINode") || !strings.Contains(d.Cluster, "attached as "+ebsVolume.unique) {
				t.Errorf("/shadow: EBS disagreement %+v: want its pod, our reason naming the CSINode, the cluster's CSI attachment", d)
			}
		case d.Kind == "would-detach" && d.Volume == three.unique && d.Node == sick:
			sawThree = true
			if !strings.Contains(d.Ours, "forced: timeout") || !strings.HasPrefix(d.Cluster, "attached") {
				t.Errorf("/shadow: forced detach disagreement %+v: want a forced detach on timeout against an attached volume", d)
			}
		default:
			t.Errorf("/shadow: unexpected open disagreement %+v", d)
		}
	}
	if !sawEBS || !sawThree {
		t.Errorf("/shadow lists the EBS volume: %v, the mounted volume of the NotReady node: %v; want both", sawEBS, sawThree)
	}
	explain := getSecure(t, secure, "/explain?"+url.Values{"volume": {"kubernetes.io/aws-ebs/" + ebsHandle}, "node": {s.node}}.Encode())
	if !strings.Contains(explain, `"disagreement"`) || !strings.Contains(explain, "would-not-attach") || !strings.Contains(explain, `"cluster": "attached as `+ebsVolume.unique) {
		t.Errorf("/explain of the EBS volume says neither the cluster's attachment nor the disagreement:\n%s", explain)
	}

	// The CSINode comes: the EBS volume is attached through CSI, as the
	// cluster did; the disagreement closes.
	if _, err := framework.CreateCSINode(s.ctx, s.client, s.node,
		[]storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-0123")}, "kubernetes.io/aws-ebs"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.StorageV1().CSINodes().Delete(t.Context(), s.node, metav1.DeleteOptions{}) })
	waitShadowMetric(t, ours, "would-not-attach", 0)

	out := ours.Output()
	for _, want := range [][]string{
		{`"Shadow disagreement"`, `kind="would-not-attach"`, `"kubernetes.io/aws-ebs/` + ebsHandle + `"`, s.ns + "/ebs"},
		{`"Shadow disagreement ended"`, `kind="would-not-attach"`, `"kubernetes.io/aws-ebs/` + ebsHandle + `"`},
		{`"Shadow disagreement"`, `kind="would-detach"`, `"` + three.unique + `"`, "forced: timeout"},
	} {
		if len(logLines(out, want...)) == 0 {
			t.Errorf("no log line with %q", want)
		}
	}
	for _, v := range []volume{one, two} {
		for _, line := range logLines(out, "Shadow disagreement", `"`+v.unique+`"`) {
			t.Errorf("a disagreement on %s, where both controllers agree: %s", v.name, line)
		}
	}
	m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// Every metric served is documented, the shadow's included.
	_, body, err := ours.Get(t.Context(), "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	served, err := parseExposition(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range compareCatalogue(served, readCatalogue(t), false) {
		t.Error(p)
	}
	for _, name := range []string{shadowOpen, shadowOpened, shadowRefused} {
		if _, ok := served[name]; !ok {
			t.Errorf("%s not served in shadow mode", name)
		}
	}
	if n := m.Sum(shadowRefused, nil); n != 0 {
		t.Errorf("%s = %v, want 0: something tried to write", shadowRefused, n)
	}
	if n := m.Sum(shadowOpened, map[string]string{"kind": "would-attach"}); n != 0 {
		t.Errorf("%s{kind=would-attach} = %v, want 0", shadowOpened, n)
	}
	stopController(t, ours)

	// Nothing written but the Lease: every other request was a read (the
	// secure port's token and access reviews are questions, not writes).
	reads := map[string]bool{"get": true, "list": true, "watch": true}
	var readCount, leaseWrites, writes int
	for _, e := range controllerRequests(t, offset) {
		p, ok := e.permission()
		if !ok || e.Stage != "ResponseComplete" {
			continue
		}
		switch {
		case reads[e.Verb]:
			readCount++
		case p.group == "coordination.k8s.io" && p.resource == "leases":
			leaseWrites++
			if e.ObjectRef.Name != "attach-detach-controller-shadow" {
				t.Errorf("the shadow wrote another Lease: %s %s", p, e.RequestURI)
			}
		case p.verb == "create" && (p.resource == "tokenreviews" || p.resource == "subjectaccessreviews"):
		default:
			writes++
			t.Errorf("the shadow wrote: %s %s", p, e.RequestURI)
		}
	}
	t.Logf("requests of the shadow in the audit log: %d reads, %d Lease writes, %d other writes", readCount, leaseWrites, writes)
	if readCount == 0 || leaseWrites == 0 {
		t.Errorf("the audit log holds %d reads and %d Lease writes of the shadow: it does not record the shadow's requests", readCount, leaseWrites)
	}
}

// logLines returns the lines of out that contain every one of parts.
func logLines(out string, parts ...string) []string {
	var lines []string
	for line := range strings.Lines(out) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			lines = append(lines, line)
		}
	}
	return lines
}

// applyShadowRBAC grants what the shadow overlay adds to the base: its
// Lease, and the bindings of the secure port (auth delegation, /explain and
// /shadow readers).
func applyShadowRBAC(t *testing.T, r *rendered) {
	t.Helper()
	setRole(t, convert[rbacv1.Role](t, find(t, r.objects, "Role", "attach-detach-controller-shadow-leader-election")))
	createRoleBinding(t, r, "attach-detach-controller-shadow-leader-election")
	applySecureRBAC(t, r)
}

// applySecureRBAC grants what the secure port needs, as r renders it: auth
// delegation, and the /explain and /shadow readers' ClusterRole.
func applySecureRBAC(t *testing.T, r *rendered) {
	t.Helper()
	setClusterRole(t, convert[rbacv1.ClusterRole](t, find(t, r.objects, "ClusterRole", "attach-detach-controller:explain")))
	createRoleBinding(t, r, "attach-detach-controller:authentication-reader")
	crb := convert[rbacv1.ClusterRoleBinding](t, find(t, r.objects, "ClusterRoleBinding", "attach-detach-controller:auth-delegator"))
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(t.Context(), crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func createRoleBinding(t *testing.T, r *rendered, name string) {
	t.Helper()
	rb := convert[rbacv1.RoleBinding](t, find(t, r.objects, "RoleBinding", name))
	if _, err := cluster.Client.RbacV1().RoleBindings(rb.Namespace).Create(t.Context(), rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// stillAttached fails unless v's VolumeAttachment exists, attached, not
// being deleted.
func stillAttached(s *scene, v volume) error {
	va, err := s.attachment(v)
	switch {
	case err != nil:
		return err
	case va == nil:
		return fmt.Errorf("VolumeAttachment %s is gone", v.attachment)
	case va.DeletionTimestamp != nil || !va.Status.Attached:
		return fmt.Errorf("VolumeAttachment %s: deleted %v, attached %v", v.attachment, va.DeletionTimestamp != nil, va.Status.Attached)
	}
	return nil
}

// waitShadowMetric waits until the open disagreements of kind are n. A
// disagreement opens after the grace period: the wait allows for it.
func waitShadowMetric(t *testing.T, c *framework.Controller, kind string, n float64) {
	t.Helper()
	framework.Eventually(t, waitTimeout+2*shadowGrace, func() (bool, error) {
		m, err := framework.ScrapeMetrics(t.Context(), c.HTTPURL+"/metrics")
		if err != nil {
			return false, nil
		}
		return len(m.Select(shadowOpen, map[string]string{"kind": kind})) == 1 &&
			m.Sum(shadowOpen, map[string]string{"kind": kind}) == n, nil
	}, "%s{kind=%q} = %v", shadowOpen, kind, n)
}

// getSecure reads path on the secure port as the cluster's admin.
func getSecure(t *testing.T, base, path string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed by design
	var body string
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
		if err != nil {
			return false, err
		}
		req.Header.Set("Authorization", "Bearer "+cluster.Config.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK, nil
	}, "GET %s: 200", path)
	return body
}

func getShadowSummary(t *testing.T, base string) shadowSummary {
	t.Helper()
	var s shadowSummary
	if err := json.Unmarshal([]byte(getSecure(t, base, "/shadow")), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestShadowOverlayServerSideDryRun renders the shadow overlay: the base's
// Deployment with --shadow on a Lease of its own, and the Role to renew
// that Lease; the API server accepts the render.
func TestShadowOverlayServerSideDryRun(t *testing.T) {
	out, objs := render(t, shadowKustomization)
	args := convert[appsv1.Deployment](t, find(t, objs, "Deployment", "attach-detach-controller")).Spec.Template.Spec.Containers[0].Args
	if lease, _ := flagValue(args, "leader-elect-resource-name"); lease != "attach-detach-controller-shadow" || !slices.Contains(args, "--shadow") {
		t.Errorf("shadow Deployment arguments %v: want --shadow and the Lease attach-detach-controller-shadow", args)
	}
	role := convert[rbacv1.Role](t, find(t, objs, "Role", "attach-detach-controller-shadow-leader-election"))
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, []string{"attach-detach-controller-shadow"}) {
		t.Errorf("shadow Role rules %+v: want get and update on the Lease attach-detach-controller-shadow", role.Rules)
	}
	applied := dryRunApply(t, out)
	if !slices.ContainsFunc(applied, func(l string) bool { return strings.HasPrefix(l, "deployment.apps/attach-detach-controller ") }) {
		t.Errorf("the Deployment is not in the dry-run output:\n%s", strings.Join(applied, "\n"))
	}
}
