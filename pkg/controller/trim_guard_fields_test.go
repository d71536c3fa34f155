package controller

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
)

// A kept field no outcome depends on is one a trim could drop unseen: each
// field the trims keep is dropped in turn (from every object of its kind)
// and the comparison must notice, unless notDecisive says why it can't.
// A trim that keeps a new field, for a new read, thus needs the world to
// hold what that read decides on.
func TestTrimGuardSeesEveryKeptField(t *testing.T) {
	world := guardWorld(t)
	// Against the trimmed world (whether it matches the world as served is
	// TestTrimGuard's question): the round trip through unstructured that
	// drops a field changes nothing by itself.
	want := guardOutcome(t, world, throughTrim)
	if d := guardDiff(want, guardOutcome(t, world, dropping("", nil))); len(d) > 0 {
		t.Fatalf("a round trip through unstructured changes the outcome:\n%s", strings.Join(d[:min(len(d), 20)], "\n"))
	}
	seen := map[string]bool{}
	for _, kf := range keptFields(t, world) {
		name := kf.String()
		seen[name] = true
		detected := len(guardDiff(want, guardOutcome(t, world, dropping(kf.kind, kf.path)))) > 0
		why, excused := notDecisive[name]
		switch {
		case !detected && !excused:
			t.Errorf("%s: kept by the trim, but dropping it changes nothing the guard compares: "+
				"add to the world what it decides, or to notDecisive why nothing can", name)
		case detected && excused:
			t.Errorf("%s: listed as not decisive (%s), but dropping it changes the outcome: remove it from notDecisive", name, why)
		}
	}
	for name := range notDecisive {
		if !seen[name] {
			t.Errorf("%s: listed in notDecisive, but no trimmed object of the world keeps it", name)
		}
	}
	t.Logf("%d kept fields dropped in turn", len(seen))
}

// notDecisive lists the fields the trims keep whose loss no outcome of the
// guard shows, and why: most are read by nothing (kept at little cost).
var notDecisive = map[string]string{
	"Node spec.taints[].effect": "the out-of-service taint counts whatever its effect, other taints not at all",
	"Node spec.taints[].value":  "the out-of-service taint counts whatever its value, other taints not at all",
	"Pod metadata.resourceVersion": "read by nothing: the informers resume from the versions of the events, " +
		"read before the transform",
	"PersistentVolume metadata.resourceVersion":      "read by nothing, as a pod's",
	"PersistentVolumeClaim metadata.resourceVersion": "read by nothing, as a pod's",
	"PersistentVolume metadata.uid":                  "read by nothing: a binding is checked on the claim's UID (claimRef.uid)",
	"PersistentVolume spec.nodeAffinity": "kept for csi-translation-lib, which carries it into the translated PV; " +
		"nothing reads a translated PV's topology (a VolumeAttachment names the PV)",
	"PersistentVolume spec.volumeMode": "read by nothing: a block volume attaches as a filesystem one does",
	"PersistentVolume status.phase":    "read by nothing: the claim's phase and the claimRef's UID say bound",
	"PersistentVolumeClaim metadata.ownerReferences[].apiVersion": "metav1.IsControlledBy compares the UID of " +
		"the controller reference alone",
	"PersistentVolumeClaim metadata.ownerReferences[].kind": "as apiVersion",
	"PersistentVolumeClaim metadata.ownerReferences[].name": "as apiVersion",
	"Pod spec.volumes[].azureFile": "a file share: nothing to attach (trimPod keeps every in-tree source, " +
		"attachable or not)",
	"Pod spec.volumes[].nfs": "as azureFile",
	"Pod spec.volumes[].persistentVolumeClaim.readOnly": "read by nothing: a claim's volume attaches as its PV " +
		"says",
	"Pod status.containerStatuses[].name": "read by nothing: whether a container runs is read from its " +
		"state",
	"Pod status.initContainerStatuses[].name":      "as containerStatuses",
	"Pod status.ephemeralContainerStatuses[].name": "as containerStatuses",
	"Pod status.containerStatuses[].state.running": "an empty state counts as running (podTerminated, as " +
		"upstream's IsPodTerminated)",
	"Pod status.initContainerStatuses[].state.running":      "as containerStatuses",
	"Pod status.ephemeralContainerStatuses[].state.running": "as containerStatuses",
}

// keptField is a field of the trimmed objects of one kind: a path, with
// "[]" for every element of a list.
type keptField struct {
	kind string
	path []string
}

// keptFields lists the fields set in the trimmed objects of the world:
// those whose removal changes the object. A list of strings counts as one
// field, and so does a map of labels or annotations, a PV's node affinity,
// and an in-tree volume source, kept whole for csi-translation-lib and the
// in-tree attachers, which read what they need of it.
func keptFields(t *testing.T, world []runtime.Object) []keptField {
	t.Helper()
	set := map[string]keptField{}
	for _, o := range world {
		switch o.(type) {
		case *v1.Pod, *v1.Node, *v1.PersistentVolume, *v1.PersistentVolumeClaim:
		default:
			continue // not trimmed
		}
		kind := reflect.TypeOf(o).Elem().Name()
		obj := throughTrim(t, o.DeepCopyObject())
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range leafPaths(u, nil) {
			f := keptField{kind: kind, path: fieldUnit(kind, p)}
			if _, ok := set[f.String()]; ok {
				continue
			}
			if !apiequality.Semantic.DeepEqual(obj, dropping(kind, f.path)(t, o.DeepCopyObject())) {
				set[f.String()] = f
			}
		}
	}
	var out []keptField
	for _, k := range slices.Sorted(maps.Keys(set)) {
		out = append(out, set[k])
	}
	return out
}

func (f keptField) String() string {
	return f.kind + " " + strings.ReplaceAll(strings.Join(f.path, "."), ".[]", "[]")
}

// leafPaths returns the paths of the leaves of v: values, and maps or lists
// with nothing set inside.
func leafPaths(v any, path []string) [][]string {
	var out [][]string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			out = append(out, leafPaths(e, append(slices.Clip(path), k))...)
		}
	case []any:
		for _, e := range v {
			out = append(out, leafPaths(e, append(slices.Clip(path), "[]"))...)
		}
	}
	if len(out) == 0 && v != nil && !reflect.ValueOf(v).IsZero() {
		out = append(out, path)
	}
	return out
}

var (
	volumeSourceKeys   = jsonKeys(reflect.TypeOf(v1.VolumeSource{}))
	pvSourceKeys       = jsonKeys(reflect.TypeOf(v1.PersistentVolumeSource{}))
	referencesToClaims = map[string]bool{"persistentVolumeClaim": true, "ephemeral": true, "csi": true}
)

// fieldUnit shortens a path to the field it belongs to (see keptFields).
func fieldUnit(kind string, p []string) []string {
	switch {
	case len(p) > 0 && p[len(p)-1] == "[]":
		return fieldUnit(kind, p[:len(p)-1])
	case len(p) > 2 && p[0] == "metadata" && (p[1] == "labels" || p[1] == "annotations"):
		return p[:2]
	case kind == "PersistentVolume" && len(p) > 2 && p[1] == "nodeAffinity":
		return p[:2]
	case kind == "Pod" && len(p) > 3 && p[1] == "volumes" && volumeSourceKeys[p[3]] && !referencesToClaims[p[3]]:
		return p[:4]
	case kind == "PersistentVolume" && len(p) > 2 && p[0] == "spec" && pvSourceKeys[p[1]] && p[1] != "csi":
		return p[:2]
	}
	return p
}

func jsonKeys(t reflect.Type) map[string]bool {
	keys := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		keys[name] = true
	}
	return keys
}

// dropping is Trim, then, for objects of kind, the removal of the field at
// path (in every element of a list on the way); with an empty kind, Trim
// and a round trip through unstructured.
func dropping(kind string, path []string) guardTransform {
	return func(t *testing.T, obj runtime.Object) runtime.Object {
		out := throughTrim(t, obj)
		if kind != "" && reflect.TypeOf(out).Elem().Name() != kind {
			return out
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(out)
		if err != nil {
			t.Fatal(err)
		}
		removePath(u, path)
		fresh := reflect.New(reflect.TypeOf(out).Elem()).Interface().(runtime.Object)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, fresh); err != nil {
			t.Fatal(err)
		}
		return fresh
	}
}

func removePath(v any, path []string) {
	if len(path) == 0 {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		if len(path) == 1 {
			delete(v, path[0])
			return
		}
		removePath(v[path[0]], path[1:])
	case []any:
		if path[0] == "[]" {
			for _, e := range v {
				removePath(e, path[1:])
			}
		}
	}
}
