package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Kustomizations, relative to the repository root.
const (
	baseKustomization    = "manifests"
	overlayKustomization = "manifests/overlays/prometheus-operator"
	shadowKustomization  = "manifests/overlays/shadow"
)

// render runs kustomize build (what kubectl kustomize runs) on a directory of
// the repository and returns the output and its objects.
func render(t *testing.T, dir string) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	cmd := exec.Command(tools.kustomize, "build", filepath.Join(repoRoot, dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v: %s", dir, err, stderr.String())
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("decode render of %s: %v", dir, err)
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return out, objs
}

// decodeObjects splits a multi-document YAML stream into objects.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
}

// find returns the one object of kind (and name, if not empty).
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q in the render, found %d", kind, name, len(found))
	}
	return found[0]
}

// convert turns an unstructured object into its typed form.
func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// rendered is what the tests use of the base.
type rendered struct {
	objects            []*unstructured.Unstructured
	serviceAccount     *unstructured.Unstructured
	clusterRole        *rbacv1.ClusterRole
	clusterRoleBinding *rbacv1.ClusterRoleBinding
	role               *rbacv1.Role
	roleBinding        *rbacv1.RoleBinding
	deployment         *appsv1.Deployment
}

func renderBase(t *testing.T) *rendered {
	t.Helper()
	return renderDir(t, baseKustomization)
}

// renderDir renders the base, or an overlay that keeps its objects.
func renderDir(t *testing.T, dir string) *rendered {
	t.Helper()
	_, objs := render(t, dir)
	return &rendered{
		objects:            objs,
		serviceAccount:     find(t, objs, "ServiceAccount", ""),
		clusterRole:        convert[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "attach-detach-controller")),
		clusterRoleBinding: convert[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "attach-detach-controller")),
		role:               convert[rbacv1.Role](t, find(t, objs, "Role", "attach-detach-controller-leader-election")),
		roleBinding:        convert[rbacv1.RoleBinding](t, find(t, objs, "RoleBinding", "attach-detach-controller-leader-election")),
		deployment:         convert[appsv1.Deployment](t, find(t, objs, "Deployment", "")),
	}
}

// args returns the controller container's arguments.
func (r *rendered) args(t *testing.T) []string {
	t.Helper()
	cs := r.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(cs))
	}
	return cs[0].Args
}

// flag returns the value of --name in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func describe(u *unstructured.Unstructured) string {
	if ns := u.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", u.GetKind(), ns, u.GetName())
	}
	return fmt.Sprintf("%s %s", u.GetKind(), u.GetName())
}
