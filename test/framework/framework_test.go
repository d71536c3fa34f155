package framework

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestCluster(t *testing.T) {
	ctx := t.Context()
	c := StartT(t)
	client := c.Client
	pids := []int{c.etcd.Pid(), c.apiserver.Pid()}

	if _, err := CreateNamespace(ctx, client, "test"); err != nil {
		t.Fatal(err)
	}
	node, err := CreateNode(ctx, client, Node("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if node.Annotations[ControllerManagedAnnotation] != "true" || !nodeReady(node) {
		t.Errorf("node: want managed and Ready, got annotations %v, conditions %v", node.Annotations, node.Status.Conditions)
	}
	if err := SetNodeReady(ctx, client, "node-1", false); err != nil {
		t.Fatal(err)
	}
	if err := SetVolumesInUse(ctx, client, "node-1", "kubernetes.io/csi/csi.test^vol-1"); err != nil {
		t.Fatal(err)
	}
	node, err = client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodeReady(node) || len(node.Status.VolumesInUse) != 1 {
		t.Errorf("node: want not Ready with one volume in use, got conditions %v, volumesInUse %v", node.Status.Conditions, node.Status.VolumesInUse)
	}

	if _, err := CreateCSIDriver(ctx, client, "csi.test", new(true)); err != nil {
		t.Fatal(err)
	}
	csiNode, err := CreateCSINode(ctx, client, "node-1", []storagev1.CSINodeDriver{CSINodeDriver("csi.test", "node-1-id")}, "kubernetes.io/gce-pd")
	if err != nil {
		t.Fatal(err)
	}
	if got := csiNode.Annotations[MigratedPluginsAnnotation]; got != "kubernetes.io/gce-pd" {
		t.Errorf("CSINode migrated plugins: got %q", got)
	}

	pv, pvc, err := CreateBoundPVC(ctx, client, "test", "claim-1", CSISource("csi.test", "vol-1"))
	if err != nil {
		t.Fatal(err)
	}
	pv, err = client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc, err = client.CoreV1().PersistentVolumeClaims("test").Get(ctx, pvc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Status.Phase != v1.VolumeBound || pvc.Status.Phase != v1.ClaimBound {
		t.Errorf("phases: want Bound/Bound, got PV %s, PVC %s", pv.Status.Phase, pvc.Status.Phase)
	}
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID || pvc.Spec.VolumeName != pv.Name {
		t.Errorf("binding: PV claimRef %v, PVC uid %s, PVC volumeName %q", pv.Spec.ClaimRef, pvc.UID, pvc.Spec.VolumeName)
	}
	if _, err := CreatePod(ctx, client, "test", "pod-1", "node-1", "claim-1"); err != nil {
		t.Fatal(err)
	}

	// The service account's token must authenticate as that account.
	path, err := c.ServiceAccountKubeconfig(ctx, "test", "controller")
	if err != nil {
		t.Fatal(err)
	}
	saConfig, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	saClient, err := kubernetes.NewForConfig(saConfig)
	if err != nil {
		t.Fatal(err)
	}
	review, err := saClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := review.Status.UserInfo.Username, "system:serviceaccount:test:controller"; got != want {
		t.Errorf("service account kubeconfig: authenticated as %q, want %q", got, want)
	}

	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Stop (kill -0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(c.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory %s still exists after Stop (stat: %v)", c.Dir, err)
	}
}

func TestStartFailsWithLogTail(t *testing.T) {
	_, err := Start(Options{
		APIServerFlags: []string{"--no-such-flag"},
		StartTimeout:   30 * time.Second,
	})
	if err == nil {
		t.Fatal("Start with an unknown apiserver flag: want error")
	}
	t.Log(err)
	if !strings.Contains(err.Error(), "unknown flag: --no-such-flag") {
		t.Errorf("error does not show the apiserver log tail: %s", err)
	}
	_, rest, _ := strings.Cut(err.Error(), "start cluster in ")
	dir, _, _ := strings.Cut(rest, ":")
	if dir == "" {
		t.Fatalf("error does not name the cluster directory: %s", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory %s still exists after a failed Start (stat: %v)", dir, err)
	}
}

func TestAPIServerBinary(t *testing.T) {
	binDir := t.TempDir()
	other := t.TempDir()
	for _, path := range []string{filepath.Join(binDir, "kube-apiserver"), filepath.Join(other, "kube-apiserver-v1.34.4"), filepath.Join(other, "named")} {
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, env, opt, want string
	}{
		{name: "default", want: filepath.Join(binDir, "kube-apiserver")},
		{name: "environment", env: filepath.Join(other, "kube-apiserver-v1.34.4"), want: filepath.Join(other, "kube-apiserver-v1.34.4")},
		{name: "option wins", env: filepath.Join(other, "kube-apiserver-v1.34.4"), opt: filepath.Join(other, "named"), want: filepath.Join(other, "named")},
		{name: "missing", env: filepath.Join(other, "none")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(APIServerBinaryEnv, tc.env)
			got, err := Options{APIServerBinary: tc.opt}.apiserverBinary(binDir)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %s, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestEventually(t *testing.T) {
	calls := 0
	Eventually(t, 5*time.Second, func() (bool, error) {
		calls++
		return calls == 3, nil
	}, "third call")
}

func nodeReady(node *v1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == v1.NodeReady {
			return cond.Status == v1.ConditionTrue
		}
	}
	return false
}
