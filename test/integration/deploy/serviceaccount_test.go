package deploy

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// applyRBAC creates or updates the rendered ServiceAccount, roles and
// bindings through the RBAC API, as `kubectl apply` would.
func applyRBAC(t *testing.T, r *rendered) {
	t.Helper()
	ctx := t.Context()
	rbac := cluster.Client.RbacV1()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: r.serviceAccount.GetNamespace(), Name: r.serviceAccount.GetName()}}
	if _, err := cluster.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	setClusterRole(t, r.clusterRole)
	setRole(t, r.role)
	crb := r.clusterRoleBinding.DeepCopy()
	if _, err := rbac.ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := r.roleBinding.DeepCopy()
	if _, err := rbac.RoleBindings(rb.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// setClusterRole creates the ClusterRole or replaces its rules.
func setClusterRole(t *testing.T, want *rbacv1.ClusterRole) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	roles := cluster.Client.RbacV1().ClusterRoles()
	cur, err := roles.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = roles.Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
	} else if err == nil {
		cur.Rules = want.DeepCopy().Rules
		_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("set ClusterRole %s: %v", want.Name, err)
	}
}

// setRole creates the Role or replaces its rules.
func setRole(t *testing.T, want *rbacv1.Role) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	roles := cluster.Client.RbacV1().Roles(want.Namespace)
	cur, err := roles.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = roles.Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
	} else if err == nil {
		cur.Rules = want.DeepCopy().Rules
		_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("set Role %s: %v", want.Name, err)
	}
}

func subjectsOf(subjects []rbacv1.Subject) []rbacSubject {
	var out []rbacSubject
	for _, s := range subjects {
		out = append(out, rbacSubject{s.Kind, s.Name, s.Namespace})
	}
	return out
}

// roleGrants tells whether role lets the controller read and renew the
// Lease name.
func roleGrants(role *rbacv1.Role, name string) bool {
	verbs := map[string]bool{}
	for _, r := range role.Rules {
		if !slices.Contains(r.APIGroups, "coordination.k8s.io") || !slices.Contains(r.Resources, "leases") {
			continue
		}
		if len(r.ResourceNames) > 0 && !slices.Contains(r.ResourceNames, name) {
			continue
		}
		for _, v := range r.Verbs {
			verbs[v] = true
		}
	}
	return verbs["get"] && verbs["update"]
}

// serviceAccountKubeconfig applies the RBAC of r and returns a kubeconfig
// with a token of its service account.
func serviceAccountKubeconfig(t *testing.T, r *rendered) string {
	t.Helper()
	applyRBAC(t, r)
	path, err := cluster.ServiceAccountKubeconfig(t.Context(), r.serviceAccount.GetNamespace(), r.serviceAccount.GetName())
	if err != nil {
		t.Fatal(err)
	}
	return path
}
