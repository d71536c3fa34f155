package deploy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// fieldManager is the field manager of everything the tests apply.
const fieldManager = "adc-deploy-test"

// serverSideApply applies every object of manifests (a YAML or JSON stream)
// as `kubectl apply --server-side --field-manager=adc-deploy-test -f -` does:
// one apply patch per object, strict field validation (kubectl's default
// --validate=strict), a namespaced object without a namespace going to
// "default", and no conflict forced. With dryRun the API server validates
// and admits the objects without storing them (--dry-run=server).
//
// It returns kubectl's line per object ("kind.group/name serverside-applied",
// plus " (server dry run)") and, after the objects that failed, their errors;
// the error is not nil if any object failed.
func serverSideApply(manifests []byte, dryRun bool) (string, error) {
	objs, err := decodeObjects(manifests)
	if err != nil {
		return "", fmt.Errorf("decode manifests: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	if err != nil {
		return "", err
	}
	client, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		return "", err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	opts := metav1.PatchOptions{FieldManager: fieldManager, FieldValidation: metav1.FieldValidationStrict}
	suffix := ""
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
		suffix = " (server dry run)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var out strings.Builder
	var errs []error
	for _, o := range objs {
		if err := applyOne(ctx, client, mapper, o, opts); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", describe(o), err))
			continue
		}
		ref := strings.ToLower(o.GetKind())
		if g := o.GroupVersionKind().Group; g != "" {
			ref += "." + g
		}
		fmt.Fprintf(&out, "%s/%s serverside-applied%s\n", ref, o.GetName(), suffix)
	}
	for _, err := range errs {
		fmt.Fprintf(&out, "Error from server: %v\n", err)
	}
	return out.String(), errors.Join(errs...)
}

func applyOne(ctx context.Context, client dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured, opts metav1.PatchOptions) error {
	gvk := o.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A CRD applied a moment ago: discover again.
		mapper.Reset()
		mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return err
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = client.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		ri = client.Resource(mapping.Resource).Namespace(ns)
	}
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// waitEstablished waits, as `kubectl wait --for=condition=Established
// --timeout=60s crd/NAME...` does, until each CustomResourceDefinition is
// established.
func waitEstablished(names ...string) error {
	client, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		return err
	}
	crds := client.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range names {
		var last error
		err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			crd, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
					return true, nil
				}
			}
			last = fmt.Errorf("not established: conditions %v", conds)
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CustomResourceDefinition %s: %w (last: %v)", name, err, last)
		}
	}
	return nil
}
