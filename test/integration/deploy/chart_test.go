package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The chart, relative to the repository root, and the release the tests
// install: named and placed as manifests/base is.
const (
	chartDir         = "charts/attach-detach-controller"
	releaseName      = "attach-detach-controller"
	releaseNamespace = "kube-system"
)

// helmLabels and helmAnnotations are what Helm's conventions add to every
// object; the rest of a render must be the kustomization's.
var (
	helmLabels      = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}
	helmAnnotations = []string{"helm.sh/resource-policy"}
)

// helmBinary is _output/bin/helm (or $ADC_BIN_DIR/helm), built by
// hack/build-helm.sh.
func helmBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(framework.BinDirEnv)
	if dir == "" {
		dir = filepath.Join(repoRoot, "_output", "bin")
	}
	p := filepath.Join(dir, "helm")
	if info, err := os.Stat(p); err != nil || info.Mode()&0o111 == 0 {
		t.Fatalf("%s: not an executable (build it with hack/build-helm.sh)", p)
	}
	return p
}

// helmTemplate runs `helm template` on the chart with args and returns the
// output and its objects.
func helmTemplate(t *testing.T, release, namespace string, args ...string) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	out, stderr, err := runHelm(t, append([]string{"template", release, filepath.Join(repoRoot, chartDir), "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("decode helm template: %v", err)
	}
	return out, objs
}

func runHelm(t *testing.T, args ...string) ([]byte, string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	// Helm keeps no state for template and lint; keep it out of $HOME.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return out, stderr.String(), err
}

// normalized returns the objects by "Kind namespace/name", without what
// Helm adds, and with the defaults the API server would fill in for a field
// one render sets and the other leaves out.
func normalized(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		o = o.DeepCopy()
		labels := o.GetLabels()
		for _, l := range helmLabels {
			delete(labels, l)
		}
		o.SetLabels(labels)
		annotations := o.GetAnnotations()
		for _, a := range helmAnnotations {
			delete(annotations, a)
		}
		o.SetAnnotations(annotations)
		if o.GetKind() == "Deployment" {
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				c := c.(map[string]any)
				// The API's default for an image not tagged latest.
				if c["imagePullPolicy"] == "IfNotPresent" {
					delete(c, "imagePullPolicy")
				}
			}
			if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
				t.Fatal(err)
			}
		}
		// One JSON form for both decoders' numbers.
		b, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		key := describe(o)
		if _, dup := out[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		out[key] = m
	}
	return out
}

// sameObjects fails the test unless both renders hold the same objects,
// field for field once normalized.
func sameObjects(t *testing.T, chart, kustomize []*unstructured.Unstructured) {
	t.Helper()
	c, k := normalized(t, chart), normalized(t, kustomize)
	for key := range k {
		if _, ok := c[key]; !ok {
			t.Errorf("%s: in the kustomize render, not in the chart's", key)
		}
	}
	for key, co := range c {
		ko, ok := k[key]
		if !ok {
			t.Errorf("%s: in the chart's render, not in the kustomize render", key)
			continue
		}
		cy, _ := yaml.Marshal(co)
		ky, _ := yaml.Marshal(ko)
		if !bytes.Equal(cy, ky) {
			t.Errorf("%s differs:\n%s", key, lineDiff(string(ky), string(cy)))
		}
	}
}

// lineDiff lists the lines of want missing from got (-) and the lines of
// got not in want (+).
func lineDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range wl {
		if !slices.Contains(gl, l) {
			fmt.Fprintf(&b, "- %s (kustomize)\n", l)
		}
	}
	for _, l := range gl {
		if !slices.Contains(wl, l) {
			fmt.Fprintf(&b, "+ %s (chart)\n", l)
		}
	}
	if b.Len() == 0 {
		return "(same lines, in another order)\n--- kustomize:\n" + want + "--- chart:\n" + got
	}
	return b.String()
}

// TestChartDefaultIsTheBase: with its default values, the chart installs
// what manifests/ installs: the same objects, RBAC, flags and placement.
func TestChartDefaultIsTheBase(t *testing.T) {
	_, chart := helmTemplate(t, releaseName, releaseNamespace)
	_, base := render(t, baseKustomization)
	sameObjects(t, chart, base)

	t.Run("the check can fail", func(t *testing.T) {
		_, other := helmTemplate(t, releaseName, releaseNamespace, "--set", "workers=11")
		c, k := normalized(t, other), normalized(t, base)
		key := "Deployment kube-system/attach-detach-controller"
		cy, _ := yaml.Marshal(c[key])
		ky, _ := yaml.Marshal(k[key])
		if bytes.Equal(cy, ky) {
			t.Fatal("a chart render with --workers=11 compares equal to the base")
		}
	})
}

// TestChartTogglesAreTheOverlays: metrics.serviceMonitor and prometheusRule
// render manifests/overlays/prometheus-operator, shadow.enabled renders
// manifests/overlays/shadow.
func TestChartTogglesAreTheOverlays(t *testing.T) {
	for _, tc := range []struct {
		overlay string
		set     string
	}{
		{overlayKustomization, "metrics.serviceMonitor.enabled=true,prometheusRule.enabled=true"},
		{shadowKustomization, "shadow.enabled=true"},
	} {
		t.Run(tc.overlay, func(t *testing.T) {
			_, chart := helmTemplate(t, releaseName, releaseNamespace, "--set", tc.set)
			_, overlay := render(t, tc.overlay)
			sameObjects(t, chart, overlay)
		})
	}
}

// TestChartFilesAreTheManifests: the files the chart reads as they are (the
// CRD, the alert rules) are the manifests' own.
func TestChartFilesAreTheManifests(t *testing.T) {
	for chartFile, manifest := range map[string]string{
		"files/csinodeinfo.yaml":    "manifests/crd/csinodeinfo.yaml",
		"files/prometheusrule.yaml": "manifests/overlays/prometheus-operator/prometheusrule.yaml",
	} {
		got, err := os.ReadFile(filepath.Join(repoRoot, chartDir, chartFile))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(repoRoot, manifest))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s/%s differs from %s: copy it (cp %s %s/%s)", chartDir, chartFile, manifest, manifest, chartDir, chartFile)
		}
	}
}

// TestChartVersion: the chart's appVersion and version, and the base's image
// tag, are the release in VERSION.
func TestChartVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))
	if !strings.HasPrefix(version, "v") || strings.Count(version, ".") != 2 {
		t.Fatalf("VERSION is %q, want vMAJOR.MINOR.PATCH", version)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	b, err = os.ReadFile(filepath.Join(repoRoot, chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != version || chart.Version != strings.TrimPrefix(version, "v") {
		t.Errorf("Chart.yaml has version %q, appVersion %q; VERSION says %s: want version %s, appVersion %s",
			chart.Version, chart.AppVersion, version, strings.TrimPrefix(version, "v"), version)
	}
	var kustomization struct {
		Images []struct {
			Name   string `json:"name"`
			NewTag string `json:"newTag"`
		} `json:"images"`
	}
	b, err = os.ReadFile(filepath.Join(repoRoot, "manifests", "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kustomization); err != nil {
		t.Fatal(err)
	}
	if len(kustomization.Images) != 1 || kustomization.Images[0].NewTag != version {
		t.Errorf("manifests/base/kustomization.yaml deploys %+v, want the tag %s of VERSION", kustomization.Images, version)
	}
	_, objs := helmTemplate(t, releaseName, releaseNamespace)
	d := convert[appsv1.Deployment](t, find(t, objs, "Deployment", ""))
	if img := d.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":"+version) {
		t.Errorf("the chart deploys %s, want the tag %s of VERSION", img, version)
	}
}

// TestChartValuesSchema: a value of the wrong shape or an unknown one is
// refused before anything renders.
func TestChartValuesSchema(t *testing.T) {
	for _, set := range []string{"image.pullPolicy=Sometimes", "replicas=3", "extraArgs[0]=workers=3", "image.digest=latest"} {
		_, stderr, err := runHelm(t, "template", releaseName, filepath.Join(repoRoot, chartDir), "--namespace", releaseNamespace, "--set", set)
		if err == nil {
			t.Errorf("helm template --set %s: rendered, want the schema to refuse it", set)
		} else if !strings.Contains(stderr, "schema") {
			t.Errorf("helm template --set %s refused for another reason: %s", set, stderr)
		}
	}
}

// TestChartServerSideDryRun applies the default render to the real API
// server with a server-side dry-run, as TestServerSideDryRun does for the
// base.
func TestChartServerSideDryRun(t *testing.T) {
	out, objs := helmTemplate(t, releaseName, releaseNamespace)
	applied := dryRunApply(t, out)
	if len(applied) != len(objs) {
		t.Errorf("dry-run applied %d objects of %d:\n%s", len(applied), len(objs), strings.Join(applied, "\n"))
	}
}

// everyToggle are values that turn on or change every switch of the chart.
const everyToggle = `
image:
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  pullPolicy: Always
imagePullSecrets: [{name: registry}]
replicaCount: 3
nodeSelector: {storage.example.com/controllers: "true"}
affinity: null
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/name: attach-detach-controller}}
priorityClassName: system-node-critical
podAnnotations: {example.com/owner: storage}
podLabels: {team: storage}
podSecurityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000}
securityContext: {capabilities: null}
serviceAccount:
  create: false
  name: storage-controllers
  annotations: {ignored: "true"}
leaderElection:
  namespace: storage-leases
  resourceName: adc
  leaseDuration: 30s
  renewDeadline: 20s
  retryPeriod: 4s
extraArgs: ["--max-wait-for-unmount=10m"]
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: kube-prometheus-stack}
    prometheusServiceAccount: {name: kps-prometheus, namespace: observability}
prometheusRule:
  enabled: true
  labels: {release: kube-prometheus-stack}
shadow:
  enabled: true
  gracePeriod: 2m
crds:
  install: false
podDisruptionBudget:
  enabled: false
`

// TestChartEveryToggle renders with every switch changed, in another
// namespace under another release name: each value lands where it must,
// and the API server accepts the render (server-side dry-run).
func TestChartEveryToggle(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(everyToggle), 0o644); err != nil {
		t.Fatal(err)
	}
	const ns, leaseNS, fullname = "storage", "storage-leases", "adc-attach-detach-controller"
	out, objs := helmTemplate(t, "adc", ns, "--values", values)

	for _, kind := range []string{"CustomResourceDefinition", "PodDisruptionBudget", "ServiceAccount"} {
		for _, o := range objs {
			if o.GetKind() == kind {
				t.Errorf("%s rendered, want none", describe(o))
			}
		}
	}
	d := convert[appsv1.Deployment](t, find(t, objs, "Deployment", fullname))
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	wantArgs := []string{
		"--leader-elect=true", "--leader-elect-resource-namespace=" + leaseNS, "--leader-elect-resource-name=adc-shadow",
		"--leader-elect-lease-duration=30s", "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=4s",
		"--secure-port=10262", "--kube-api-qps=20", "--kube-api-burst=30", "--workers=10", "--v=2",
		"--shadow", "--shadow-grace-period=2m", "--max-wait-for-unmount=10m",
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"image", c.Image, "ghcr.io/kube-attach/attach-detach-controller@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"imagePullPolicy", string(c.ImagePullPolicy), "Always"},
		{"args", c.Args, wantArgs},
		{"replicas", *d.Spec.Replicas, int32(3)},
		{"imagePullSecrets", len(pod.ImagePullSecrets) == 1 && pod.ImagePullSecrets[0].Name == "registry", true},
		{"nodeSelector", pod.NodeSelector["storage.example.com/controllers"], "true"},
		{"affinity", pod.Affinity == nil, true},
		{"topologySpreadConstraints", len(pod.TopologySpreadConstraints), 1},
		{"priorityClassName", pod.PriorityClassName, "system-node-critical"},
		{"podAnnotations", d.Spec.Template.Annotations["example.com/owner"], "storage"},
		{"podLabels", d.Spec.Template.Labels["team"], "storage"},
		{"selector kept", d.Spec.Selector.MatchLabels, map[string]string{"app.kubernetes.io/name": "attach-detach-controller"}},
		{"podSecurityContext", *pod.SecurityContext.RunAsUser, int64(1000)},
		{"securityContext", c.SecurityContext.Capabilities == nil && *c.SecurityContext.ReadOnlyRootFilesystem, true},
		{"serviceAccountName", pod.ServiceAccountName, "storage-controllers"},
		{"namespace", d.Namespace, ns},
	}
	for _, ch := range checks {
		if fmt.Sprint(ch.got) != fmt.Sprint(ch.want) {
			t.Errorf("%s: got %v, want %v", ch.what, ch.got, ch.want)
		}
	}
	// Every binding names the existing account; the authentication reader
	// stays in kube-system, the Lease roles go where the Lease is.
	for _, o := range objs {
		switch o.GetKind() {
		case "RoleBinding", "ClusterRoleBinding":
			b := convert[rbacv1.RoleBinding](t, o)
			if b.Name == fullname+":metrics-reader" {
				if b.Subjects[0].Name != "kps-prometheus" || b.Subjects[0].Namespace != "observability" {
					t.Errorf("%s binds %v, want observability/kps-prometheus", describe(o), b.Subjects)
				}
				continue
			}
			if len(b.Subjects) != 1 || b.Subjects[0].Name != "storage-controllers" || b.Subjects[0].Namespace != ns {
				t.Errorf("%s binds %v, want %s/storage-controllers", describe(o), b.Subjects, ns)
			}
		}
	}
	find(t, objs, "RoleBinding", fullname+":authentication-reader")
	if got := find(t, objs, "RoleBinding", fullname+":authentication-reader").GetNamespace(); got != "kube-system" {
		t.Errorf("the authentication reader binding is in %s, want kube-system", got)
	}
	shadowRole := convert[rbacv1.Role](t, find(t, objs, "Role", fullname+"-shadow-leader-election"))
	if shadowRole.Namespace != leaseNS || !slices.Equal(shadowRole.Rules[0].ResourceNames, []string{"adc-shadow"}) {
		t.Errorf("shadow Lease role %s/%s grants %v, want adc-shadow in %s", shadowRole.Namespace, shadowRole.Name, shadowRole.Rules[0].ResourceNames, leaseNS)
	}
	sm := find(t, objs, "ServiceMonitor", fullname)
	if sm.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v, want release: kube-prometheus-stack", sm.GetLabels())
	}
	rule := find(t, objs, "PrometheusRule", fullname)
	ruleYAML, _ := yaml.Marshal(rule.Object)
	if !strings.Contains(string(ruleYAML), `job="`+fullname+`-metrics"`) || strings.Contains(string(ruleYAML), `job="attach-detach-controller-metrics"`) ||
		!strings.Contains(string(ruleYAML), `name="adc-shadow"`) || rule.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule does not select the release's job %s-metrics and Lease adc-shadow, or lacks its labels:\n%s", fullname, ruleYAML)
	}
	if svc := find(t, objs, "Service", fullname+"-metrics"); len(svc.GetAnnotations()) != 0 {
		t.Errorf("Service keeps the scrape annotations %v beside the ServiceMonitor", svc.GetAnnotations())
	}

	ctx := context.Background()
	for _, name := range []string{ns, leaseNS} {
		if _, err := framework.CreateNamespace(ctx, cluster.Client, name); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if o, err := serverSideApply([]byte(monitoringCRDs), false); err != nil {
		t.Fatalf("install stand-in monitoring CRDs: %v\n%s", err, o)
	}
	if err := waitEstablished("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"); err != nil {
		t.Fatalf("wait for stand-in CRDs: %v", err)
	}
	applied := dryRunApply(t, out)
	if len(applied) != len(objs) {
		t.Errorf("dry-run applied %d objects of %d:\n%s", len(applied), len(objs), strings.Join(applied, "\n"))
	}
}

// TestChartHelmInstall runs `helm install --dry-run=server` against the real
// API server, as a newcomer's first install would go (every object
// validated by the server, nothing stored), and reads the notes it prints:
// how to check the Lease and how to ask /explain.
func TestChartHelmInstall(t *testing.T) {
	out, stderr, err := runHelm(t, "install", releaseName, filepath.Join(repoRoot, chartDir),
		"--namespace", releaseNamespace, "--dry-run=server", "--kubeconfig", cluster.Kubeconfig)
	if err != nil {
		t.Fatalf("helm install --dry-run=server: %v\n%s%s", err, out, stderr)
	}
	_, notes, found := strings.Cut(string(out), "\nNOTES:\n")
	if !found {
		t.Fatalf("helm install printed no notes:\n%s", out)
	}
	for _, want := range []string{
		"kubectl -n kube-system get lease attach-detach-controller -o jsonpath='{.spec.holderIdentity}",
		"--clusterrole=attach-detach-controller:explain",
		"kubectl adc why pod/<name> -n <namespace>\n",
		"https://localhost:10262/explain?pod=<namespace>/<name>",
		"--controllers=*,-attachdetach",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("the notes lack %q:\n%s", want, notes)
		}
	}
}
