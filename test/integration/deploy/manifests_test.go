package deploy

import (
	"bytes"
	"k8s.io/klog/v2"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	namespace = "kube-system"
	image     = "ghcr.io/kube-attach/attach-detach-controller"
)

// TestBaseManifests checks what the Deployment promises operators: HA with
// leader election, probes on the HTTP endpoint, a locked-down pod, and a
// Service, PodDisruptionBudget and RBAC that fit it.
func TestBaseManifests(t *testing.T) {
	r := renderBase(t)
	find(t, r.objects, "CustomResourceDefinition", "csinodeinfos.csi.storage.k8s.io")
	for _, o := range r.objects {
		if o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
			continue
		}
		if o.GetNamespace() != namespace {
			t.Errorf("%s: namespace %q, want %q", describe(o), o.GetNamespace(), namespace)
		}
	}

	sa := r.serviceAccount.GetName()
	for _, b := range []struct {
		what     string
		subjects []rbacSubject
		roleKind string
		roleName string
		wantKind string
		wantName string
	}{
		{"ClusterRoleBinding", subjectsOf(r.clusterRoleBinding.Subjects), r.clusterRoleBinding.RoleRef.Kind, r.clusterRoleBinding.RoleRef.Name, "ClusterRole", r.clusterRole.Name},
		{"RoleBinding", subjectsOf(r.roleBinding.Subjects), r.roleBinding.RoleRef.Kind, r.roleBinding.RoleRef.Name, "Role", r.role.Name},
	} {
		if b.roleKind != b.wantKind || b.roleName != b.wantName {
			t.Errorf("%s binds %s %s, want %s %s", b.what, b.roleKind, b.roleName, b.wantKind, b.wantName)
		}
		if len(b.subjects) != 1 || b.subjects[0] != (rbacSubject{"ServiceAccount", sa, namespace}) {
			t.Errorf("%s subjects %v, want the ServiceAccount %s/%s", b.what, b.subjects, namespace, sa)
		}
	}

	d := r.deployment
	spec := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	if spec.ServiceAccountName != sa {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, sa)
	}
	if spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName %q, want system-cluster-critical", spec.PriorityClassName)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	if sel := d.Spec.Selector.MatchLabels; !labels.SelectorFromSet(sel).Matches(podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v", sel, podLabels)
	}
	args := r.args(t)
	if v, _ := flagValue(args, "leader-elect"); v != "true" {
		t.Errorf("args %v: want --leader-elect=true", args)
	}
	// The Role grants the Lease by name and namespace: the flags must name
	// the same one (the defaults are kube-system/attach-detach-controller).
	leaseName, ok := flagValue(args, "leader-elect-resource-name")
	if !ok {
		leaseName = "attach-detach-controller"
	}
	if ns, ok := flagValue(args, "leader-elect-resource-namespace"); ok && ns != r.role.Namespace {
		t.Errorf("lease namespace %q, but the Role is in %q", ns, r.role.Namespace)
	}
	if !roleGrants(r.role, leaseName) {
		t.Errorf("the Role does not grant get and update on the Lease %q", leaseName)
	}
	if v, ok := flagValue(args, "http-endpoint"); ok {
		t.Errorf("args %v: --http-endpoint=%s serves /metrics without authentication; the Deployment must use --secure-port only", args, v)
	}
	portText, ok := flagValue(args, "secure-port")
	if !ok {
		t.Fatalf("args %v: no --secure-port, so no /metrics, /healthz, /readyz", args)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port == 0 {
		t.Fatalf("--secure-port=%s: want a port", portText)
	}

	c := spec.Containers[0]
	if !strings.HasPrefix(c.Image, image+":") || strings.HasSuffix(c.Image, ":latest") {
		t.Errorf("image %q, want %s:<release>", c.Image, image)
	}
	var portName string
	for _, p := range c.Ports {
		if int(p.ContainerPort) == port {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Errorf("no container port %d (--secure-port)", port)
	}
	for _, p := range []struct {
		what  string
		probe *v1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.what)
			continue
		}
		g := p.probe.HTTPGet
		if g.Scheme != v1.URISchemeHTTPS {
			t.Errorf("%s probe scheme %q, want HTTPS (the secure port)", p.what, g.Scheme)
		}
		if g.Path != p.path || (g.Port.String() != portName && g.Port.IntValue() != port) {
			t.Errorf("%s probe %s on port %s, want %s on %d (%s)", p.what, g.Path, g.Port.String(), p.path, port, portName)
		}
	}
	for _, res := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			t.Errorf("no %s request", res)
		}
		if _, ok := c.Resources.Limits[res]; !ok {
			t.Errorf("no %s limit", res)
		}
	}
	psc, sc := spec.SecurityContext, c.SecurityContext
	switch {
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Error("pod securityContext: want runAsNonRoot: true")
	case psc.SeccompProfile == nil || psc.SeccompProfile.Type != v1.SeccompProfileTypeRuntimeDefault:
		t.Error("pod securityContext: want seccompProfile RuntimeDefault")
	case psc.RunAsUser == nil || *psc.RunAsUser == 0:
		t.Error("pod securityContext: want a non-zero runAsUser (the image's nonroot user, 65532)")
	}
	switch {
	case sc == nil:
		t.Error("no container securityContext")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("container securityContext: want allowPrivilegeEscalation: false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("container securityContext: want readOnlyRootFilesystem: true")
	case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0:
		t.Error("container securityContext: want capabilities drop [ALL], add none")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("container securityContext: privileged")
	}
	spread := false
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		terms := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
		for _, term := range terms {
			if term.TopologyKey == v1.LabelHostname && term.LabelSelector != nil &&
				labels.SelectorFromSet(term.LabelSelector.MatchLabels).Matches(podLabels) {
				spread = true
			}
		}
	}
	if !spread {
		t.Error("no pod anti-affinity spreading the replicas over nodes (kubernetes.io/hostname)")
	}
	if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Error("pod anti-affinity between the replicas is not required")
	}
	// On the control plane: it must run when every worker is down.
	onControlPlane := false
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key == "node-role.kubernetes.io/control-plane" && e.Operator == v1.NodeSelectorOpExists {
					onControlPlane = true
				}
			}
		}
	}
	if !onControlPlane {
		t.Error("no required node affinity to control-plane nodes (node-role.kubernetes.io/control-plane)")
	}
	tolerates := func(key string, effect v1.TaintEffect) bool {
		taint := &v1.Taint{Key: key, Effect: effect}
		for _, tol := range spec.Tolerations {
			if tol.ToleratesTaint(klog.Background(), taint, false) {
				return true
			}
		}
		return false
	}
	for _, taint := range []struct {
		key    string
		effect v1.TaintEffect
	}{
		{"node-role.kubernetes.io/control-plane", v1.TaintEffectNoSchedule},
		{"node-role.kubernetes.io/master", v1.TaintEffectNoSchedule},
		{v1.TaintNodeNotReady, v1.TaintEffectNoExecute},
		{v1.TaintNodeUnreachable, v1.TaintEffectNoExecute},
	} {
		if !tolerates(taint.key, taint.effect) {
			t.Errorf("no toleration of the taint %s:%s", taint.key, taint.effect)
		}
	}
	gomemlimit := false
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			gomemlimit = true
		}
	}
	if !gomemlimit {
		t.Error("no GOMEMLIMIT from the container's memory limit")
	}

	svc := convert[v1.Service](t, find(t, r.objects, "Service", ""))
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	if len(svc.Spec.Ports) != 1 || (svc.Spec.Ports[0].TargetPort.String() != portName && svc.Spec.Ports[0].TargetPort.IntValue() != port) {
		t.Errorf("Service ports %v, want one targeting %s (%d)", svc.Spec.Ports, portName, port)
	}
	if a := svc.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(port) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("Service annotations %v, want prometheus.io/scrape true, port %d, path /metrics", a, port)
	}

	pdb := convert[policyv1.PodDisruptionBudget](t, find(t, r.objects, "PodDisruptionBudget", ""))
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PodDisruptionBudget: want minAvailable 1, got %v / maxUnavailable %v", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("PodDisruptionBudget: want unhealthyPodEvictionPolicy AlwaysAllow, got %v", p)
	}
	if pdb.Spec.Selector == nil || !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector does not select the pods %v", podLabels)
	}
}

type rbacSubject struct{ kind, name, namespace string }

// TestServerSideDryRun applies the rendered base to the real API server with
// a server-side dry-run: every object passes validation and admission
// (kube-system exists, as does the system-cluster-critical priority class).
// A broken render is refused, so the check can fail.
func TestServerSideDryRun(t *testing.T) {
	out, objs := render(t, baseKustomization)
	applied := dryRunApply(t, out)
	for _, o := range objs {
		// "deployment.apps/name ...", "service/name ..."
		kind := strings.ToLower(o.GetKind())
		found := false
		for _, line := range applied {
			ref, _, _ := strings.Cut(line, " ")
			typ, name, _ := strings.Cut(ref, "/")
			if (typ == kind || strings.HasPrefix(typ, kind+".")) && name == o.GetName() &&
				strings.HasSuffix(line, "(server dry run)") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s not in the dry-run output:\n%s", describe(o), strings.Join(applied, "\n"))
		}
	}

	t.Run("a broken render is refused", func(t *testing.T) {
		var broken bytes.Buffer
		for _, o := range objs {
			o = o.DeepCopy()
			if o.GetKind() == "PodDisruptionBudget" {
				// minAvailable and maxUnavailable are exclusive.
				if err := unstructured.SetNestedField(o.Object, int64(1), "spec", "maxUnavailable"); err != nil {
					t.Fatal(err)
				}
			}
			writeDoc(t, &broken, o)
		}
		if out, err := serverSideApply(broken.Bytes(), true); err == nil {
			t.Fatalf("dry-run accepted a PodDisruptionBudget with minAvailable and maxUnavailable:\n%s", out)
		} else if !strings.Contains(out, "maxUnavailable") {
			t.Fatalf("dry-run refused the render for another reason: %s", out)
		}
	})
}

// TestOverlayServerSideDryRun renders the prometheus-operator overlay and
// dry-runs it after installing stand-ins for the ServiceMonitor and
// PrometheusRule CRDs, which the test API server does not have.
func TestOverlayServerSideDryRun(t *testing.T) {
	out, objs := render(t, overlayKustomization)
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "Deployment"} {
		find(t, objs, kind, "")
	}
	find(t, objs, "ClusterRole", "attach-detach-controller")
	// Prometheus may read /metrics.
	b := convert[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "attach-detach-controller:metrics-reader"))
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != "attach-detach-controller:metrics-reader" || len(b.Subjects) != 1 {
		t.Errorf("ClusterRoleBinding %s binds %s %s to %v, want the ClusterRole attach-detach-controller:metrics-reader to Prometheus' service account", b.Name, b.RoleRef.Kind, b.RoleRef.Name, b.Subjects)
	}
	sm := find(t, objs, "ServiceMonitor", "")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	for _, e := range endpoints {
		e := e.(map[string]any)
		if e["scheme"] != "https" || (e["bearerTokenFile"] == nil && e["authorization"] == nil) {
			t.Errorf("ServiceMonitor endpoint %v: want scheme https with a bearer token", e)
		}
	}
	svc := find(t, objs, "Service", "")
	if len(svc.GetAnnotations()) != 0 {
		t.Errorf("overlay Service keeps the scrape annotations %v: Prometheus would scrape it twice", svc.GetAnnotations())
	}
	if o, err := serverSideApply([]byte(monitoringCRDs), false); err != nil {
		t.Fatalf("install stand-in monitoring CRDs: %v\n%s", err, o)
	}
	if err := waitEstablished("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"); err != nil {
		t.Fatalf("wait for stand-in CRDs: %v", err)
	}
	applied := dryRunApply(t, out)
	for _, kind := range []string{"servicemonitor.monitoring.coreos.com/", "prometheusrule.monitoring.coreos.com/"} {
		found := false
		for _, line := range applied {
			found = found || strings.HasPrefix(line, kind)
		}
		if !found {
			t.Errorf("%s not in the dry-run output:\n%s", kind, strings.Join(applied, "\n"))
		}
	}
}

// monitoringCRDs are stand-ins for prometheus-operator's CRDs: the group,
// version, kinds and scope of the real ones, with the spec left open.
const monitoringCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {plural: servicemonitors, singular: servicemonitor, kind: ServiceMonitor, listKind: ServiceMonitorList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {plural: prometheusrules, singular: prometheusrule, kind: PrometheusRule, listKind: PrometheusRuleList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// dryRunApply server-side applies manifests with a server dry-run and
// returns kubectl's lines ("kind.group/name serverside-applied (server dry
// run)").
func dryRunApply(t *testing.T, manifests []byte) []string {
	t.Helper()
	out, err := serverSideApply(manifests, true)
	if err != nil {
		t.Fatalf("server-side dry-run: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

func writeDoc(t *testing.T, w *bytes.Buffer, o *unstructured.Unstructured) {
	t.Helper()
	b, err := yaml.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("---\n")
	w.Write(b)
}
