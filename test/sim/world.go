package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
)

// Resources the controller watches, in the order the world lists them.
const (
	rPods        = "pods"
	rPVCs        = "persistentvolumeclaims"
	rPVs         = "persistentvolumes"
	rNodes       = "nodes"
	rCSINodes    = "csinodes"
	rCSIDrivers  = "csidrivers"
	rAttachments = "volumeattachments"
)

var resources = []string{rPods, rPVCs, rPVs, rNodes, rCSINodes, rCSIDrivers, rAttachments}

type eventType int

const (
	added eventType = iota
	updated
	deleted
	// replaced is an object of a relist: an update of the informer's copy,
	// or an add (not of the initial list) when it has none.
	replaced
	// tombstone is a delete a relist found: the object is gone from the
	// list, and the handlers get a DeletedFinalStateUnknown holding the
	// informer's last copy.
	tombstone
)

var eventNames = []string{"added", "updated", "deleted", "replaced", "deleted (tombstone)"}

// event is one watch event, as an informer receives it.
type event struct {
	typ eventType
	obj runtime.Object
	at  time.Time
	// initial: an add of the informer's initial list, as client-go marks
	// it (isInInitialList).
	initial bool
}

// object is what every stored object is.
type object interface {
	metav1.Object
	runtime.Object
}

// world is the API server and etcd: every object, a global resource
// version, and per resource the watch events not yet delivered to the
// controller's informers (in order: one watch stream per resource).
type world struct {
	s       *Sim
	objects map[string]map[string]object
	pending map[string][]event
	rv      int
	uid     int
	// refused are the writes ("delete volumeattachments") a directed test
	// has the API refuse, before they land, until it lifts the refusal.
	refused map[string]bool
	// lost are the writes ("delete volumeattachments", "iscsi detach") a
	// directed test has land with their answer lost, until it lifts it.
	lost map[string]bool
	// attacherHeld: a directed test keeps the external-attacher from
	// acting (a detach under way for a while).
	attacherHeld bool
	// held are the resources whose events a directed test keeps from the
	// informers (a watch that lags) until it lifts it.
	held map[string]bool
}

func newWorld(s *Sim) *world {
	w := &world{s: s, objects: map[string]map[string]object{}, pending: map[string][]event{}, refused: map[string]bool{}, lost: map[string]bool{}, held: map[string]bool{}}
	for _, r := range resources {
		w.objects[r] = map[string]object{}
	}
	return w
}

func keyOf(o object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

func (w *world) get(resource, key string) object { return w.objects[resource][key] }

// list returns a resource's objects sorted by key.
func (w *world) list(resource string) []object {
	keys := make([]string, 0, len(w.objects[resource]))
	for k := range w.objects[resource] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]object, len(keys))
	for i, k := range keys {
		out[i] = w.objects[resource][k]
	}
	return out
}

func (w *world) emit(resource string, typ eventType, o object) {
	w.pending[resource] = append(w.pending[resource], event{typ: typ, obj: o.DeepCopyObject(), at: w.s.clock.Now()})
}

// create stores o (its UID and resource version set) and emits its event.
func (w *world) create(resource string, o object) object {
	w.rv++
	w.uid++
	o.SetResourceVersion(strconv.Itoa(w.rv))
	if o.GetUID() == "" {
		o.SetUID(types.UID(fmt.Sprintf("uid-%d", w.uid)))
	}
	w.objects[resource][keyOf(o)] = o
	w.emit(resource, added, o)
	return o
}

// update stores the changed o and emits its event. A write that changes
// nothing is no write, as etcd's store has it: no new resource version, no
// watch event (the API answers with the object as it is). It reports
// whether o changed the object.
func (w *world) update(resource string, o object) bool {
	if old := w.objects[resource][keyOf(o)]; old != nil && old.GetUID() == o.GetUID() {
		o.SetResourceVersion(old.GetResourceVersion())
		if apiequality.Semantic.DeepEqual(old, o) {
			return false
		}
	}
	w.rv++
	o.SetResourceVersion(strconv.Itoa(w.rv))
	w.objects[resource][keyOf(o)] = o
	w.emit(resource, updated, o)
	return true
}

// remove deletes the object at key (it is gone: finalizers done). Its
// delete event carries its last state at the revision of the delete, as the
// API server's watch sends it: what was written before the delete is older.
func (w *world) remove(resource, key string) {
	o, ok := w.objects[resource][key]
	if !ok {
		return
	}
	w.rv++
	delete(w.objects[resource], key)
	o = o.DeepCopyObject().(object)
	o.SetResourceVersion(strconv.Itoa(w.rv))
	w.emit(resource, deleted, o)
}

// deleteObject is a delete request: an object with finalizers only gets a
// deletionTimestamp.
func (w *world) deleteObject(resource, key string) {
	o := w.objects[resource][key]
	if o == nil {
		return
	}
	if len(o.GetFinalizers()) == 0 {
		w.remove(resource, key)
		return
	}
	if o.GetDeletionTimestamp() == nil {
		o = o.DeepCopyObject().(object)
		now := metav1.NewTime(w.s.clock.Now())
		o.SetDeletionTimestamp(&now)
		w.update(resource, o)
	}
}

func (w *world) node(name string) *v1.Node {
	if o := w.get(rNodes, name); o != nil {
		return o.(*v1.Node)
	}
	return nil
}

func (w *world) attachments() []*storagev1.VolumeAttachment {
	var out []*storagev1.VolumeAttachment
	for _, o := range w.list(rAttachments) {
		out = append(out, o.(*storagev1.VolumeAttachment))
	}
	return out
}

// errInjected is an API failure the simulation injects.
var errInjected = apierrors.NewInternalError(fmt.Errorf("injected failure"))

// react serves the controller's API writes: VolumeAttachment create and
// delete, node status patch (the task has yielded before: client.go). A
// write may fail before or after it lands, and a controller killed while
// the call was in flight never gets its answer.
func (w *world) react(action k8stesting.Action) (bool, runtime.Object, error) {
	s := w.s
	killed := s.current != nil && s.current.killed
	what := action.GetVerb() + " " + action.GetResource().Resource
	if sub := action.GetSubresource(); sub != "" {
		what += "/" + sub
	}
	if killed {
		s.tracef("  %s: no answer, the controller is gone", what)
		s.noteCreate(action, false)
		return true, nil, fmt.Errorf("connection refused")
	}
	kind := what
	if w.refused[what] {
		s.stats["test: API write refused"]++
		s.tracef("  %s: refused by the test", what)
		return true, nil, apierrors.NewForbidden(action.GetResource().GroupResource(), "", fmt.Errorf("refused by the test"))
	}
	if s.faults && s.chance(s.cfg.APIFailure) {
		s.stats["fault: API write failed"]++
		s.tracef("  %s: injected failure", what)
		s.noteCreate(action, false)
		return true, nil, errInjected
	}
	var obj runtime.Object
	var err error
	handled := true
	switch a := action.(type) {
	case k8stesting.CreateAction:
		if a.GetResource().Resource != rAttachments {
			handled = false
			break
		}
		obj, err = w.createAttachment(a.GetObject().(*storagev1.VolumeAttachment))
		what += " " + a.GetObject().(*storagev1.VolumeAttachment).Name
	case k8stesting.DeleteAction:
		if a.GetResource().Resource != rAttachments {
			handled = false
			break
		}
		err = w.deleteAttachment(a.GetName(), a.GetDeleteOptions())
		what += " " + a.GetName()
	case k8stesting.PatchAction:
		if a.GetResource().Resource != rNodes || a.GetSubresource() != "status" {
			handled = false
			break
		}
		obj, err = w.patchNodeStatus(a.GetName(), a.GetPatch())
		what += " " + a.GetName()
	case k8stesting.GetAction: // after the cases of actions that also name an object
		r := a.GetResource().Resource
		if r != rAttachments && r != rNodes {
			handled = false
			break
		}
		what += " " + a.GetName()
		if o := w.get(r, a.GetName()); o != nil {
			obj = o.DeepCopyObject()
		} else {
			err = apierrors.NewNotFound(schema.GroupResource{Group: a.GetResource().Group, Resource: r}, a.GetName())
		}
		// A read lands nothing: no answer to lose.
		s.tracef("  %s: %v", what, errText(err))
		return true, obj, err
	default:
		handled = false
	}
	if !handled || (obj == nil && err == nil && action.GetVerb() != "delete") {
		s.violate("API", "unexpected API call %s", what)
		return true, nil, fmt.Errorf("unexpected call %s", what)
	}
	if err == nil || apierrors.IsNotFound(err) {
		s.noteCreate(action, true)
	}
	if err == nil && w.lost[kind] {
		s.stats["test: API write landed, answer lost"]++
		s.tracef("  %s: landed, answer lost by the test", what)
		return true, nil, apierrors.NewTimeoutError("the test lost the answer", 1)
	}
	if err == nil && s.faults && s.chance(s.cfg.APILostAnswer) {
		// The write landed; its answer is lost.
		s.stats["fault: API write landed, answer lost"]++
		s.stats["fault: API write landed, answer lost: "+action.GetVerb()+" "+action.GetResource().Resource]++
		s.tracef("  %s: landed, answer lost", what)
		return true, nil, apierrors.NewTimeoutError("injected: answer lost", 1)
	}
	if s.recovery != nil && err == nil {
		// Written while the pods are still read (the controller's first
		// steps after a start): only attaches and additions may be.
		s.stats["recovery: "+action.GetVerb()+" "+action.GetResource().Resource+" while pods are read"]++
	}
	s.tracef("  %s: %v", what, errText(err))
	return true, obj, err
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

var vaResource = schema.GroupResource{Group: "storage.k8s.io", Resource: rAttachments}

func (w *world) createAttachment(va *storagev1.VolumeAttachment) (runtime.Object, error) {
	if w.get(rAttachments, va.Name) != nil {
		return nil, apierrors.NewAlreadyExists(vaResource, va.Name)
	}
	va = va.DeepCopy()
	w.create(rAttachments, va)
	w.s.checkAttachmentCreated(va)
	return va.DeepCopy(), nil
}

func (w *world) deleteAttachment(name string, opts metav1.DeleteOptions) error {
	o := w.get(rAttachments, name)
	if o == nil {
		return apierrors.NewNotFound(vaResource, name)
	}
	va := o.(*storagev1.VolumeAttachment)
	if p := opts.Preconditions; p != nil && p.UID != nil && *p.UID != va.UID {
		return apierrors.NewConflict(vaResource, name, fmt.Errorf("UID precondition failed"))
	}
	if va.DeletionTimestamp == nil {
		w.s.checkDetachStart(attachmentVolume(va), va.Spec.NodeName)
	}
	w.deleteObject(rAttachments, name)
	return nil
}

// patchNodeStatus applies the controller's merge patch of
// status.volumesAttached.
func (w *world) patchNodeStatus(name string, patch []byte) (runtime.Object, error) {
	n := w.node(name)
	if n == nil {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: rNodes}, name)
	}
	var p struct {
		Status struct {
			VolumesAttached []v1.AttachedVolume `json:"volumesAttached"`
		} `json:"status"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	var fields map[string]map[string]any
	if err := json.Unmarshal(patch, &fields); err != nil || len(fields) != 1 || len(fields["status"]) != 1 {
		w.s.violate("API", "node status patch touches more than status.volumesAttached: %s", patch)
	}
	isManaged := n.Annotations[managed] != ""
	if o, ok, _ := w.s.inf[rNodes].GetStore().GetByKey(name); ok {
		cached := o.(*v1.Node).Annotations[managed] != ""
		if cached != isManaged {
			w.s.stats["fault: node status answer shows a change of management not read yet"]++
		}
		if was, ok := w.s.answeredManaged[name]; ok && !was && isManaged && cached && !w.s.readUnmanaged[name] {
			w.s.stats["fault: node status answers show management gone and back, not read yet"]++
		}
	}
	w.s.answeredManaged[name] = isManaged
	w.s.readUnmanaged[name] = false
	n = n.DeepCopy()
	n.Status.VolumesAttached = p.Status.VolumesAttached
	if !w.update(rNodes, n) {
		w.s.stats["fault: write that changes nothing (no new version, no event): node status"]++
		w.s.tracef("  patch nodes/status %s changes nothing: no new version, no event", name)
	}
	// The controller's own write replaces the whole list: what a third
	// party listed is now the controller's doing.
	delete(w.s.thirdPartyListed, name)
	delete(w.s.thirdPartyRemoved, name)
	return w.node(name).DeepCopy(), nil
}

// attachmentVolume is the unique volume name a VolumeAttachment attaches.
func attachmentVolume(va *storagev1.VolumeAttachment) string {
	if va.Spec.Source.PersistentVolumeName != nil {
		return *va.Spec.Source.PersistentVolumeName
	}
	if s := va.Spec.Source.InlineVolumeSpec; s != nil && s.CSI != nil {
		return "inline:" + s.CSI.VolumeHandle
	}
	return "?"
}

// informer is a shared informer whose events the simulation delivers: its
// cache and handlers are the controller's, its timing is the scheduler's.
type informer struct {
	toolscache.SharedIndexInformer // only the methods below are used
	indexer                        toolscache.Indexer
	handlers                       []toolscache.ResourceEventHandler
	transform                      func(any) (any, error)
}

func newInformer(transform func(any) (any, error)) *informer {
	return &informer{
		indexer:   toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{}),
		transform: transform,
	}
}

func (i *informer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	i.handlers = append(i.handlers, h)
	return delivered{}, nil
}

// delivered is the registration of a handler the simulation calls directly: every
// event has reached it by the time it is asked.
type delivered struct {
	toolscache.ResourceEventHandlerRegistration // only HasSynced is used
}

func (delivered) HasSynced() bool { return true }

func (i *informer) AddIndexers(ix toolscache.Indexers) error { return i.indexer.AddIndexers(ix) }
func (i *informer) GetIndexer() toolscache.Indexer           { return i.indexer }
func (i *informer) GetStore() toolscache.Store               { return i.indexer }
func (i *informer) HasSynced() bool                          { return true }

// deliver applies one watch event to the cache and calls the handlers.
func (i *informer) deliver(ev event) {
	if ev.typ == tombstone {
		// The informer's own copy, not transformed again (client-go
		// transforms only what the API sends).
		key, _ := toolscache.MetaNamespaceKeyFunc(ev.obj)
		_ = i.indexer.Delete(ev.obj)
		for _, h := range i.handlers {
			h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: key, Obj: ev.obj})
		}
		return
	}
	obj, err := i.transform(ev.obj.DeepCopyObject())
	if err != nil {
		panic(err)
	}
	key, _ := toolscache.MetaNamespaceKeyFunc(obj)
	old, exists, _ := i.indexer.GetByKey(key)
	switch ev.typ {
	case deleted:
		if !exists {
			return
		}
		_ = i.indexer.Delete(obj)
		for _, h := range i.handlers {
			h.OnDelete(obj)
		}
	default:
		if exists {
			_ = i.indexer.Update(obj)
			for _, h := range i.handlers {
				h.OnUpdate(old, obj)
			}
			return
		}
		_ = i.indexer.Add(obj)
		for _, h := range i.handlers {
			h.OnAdd(obj, ev.initial)
		}
	}
}

// relist is what the informer gets when its watch breaks and it lists
// again, as client-go's Replace hands it over: first a delete for every
// cached object the list lacks, its object a DeletedFinalStateUnknown
// holding the cached (stale) copy; then every listed object whose version
// differs from the cached one, as one update however many versions were
// skipped (an object deleted and created again comes as an update with a
// new UID), or as an add (not of the initial list). A listed object the
// cache holds at the same version reaches no handler (no resync period).
// The events still on their way in the broken watch are lost.
func (i *informer) relist(w *world, resource string) (stats map[string]int) {
	stats = map[string]int{}
	now := w.s.clock.Now()
	var evs []event
	keys := i.indexer.ListKeys()
	slices.Sort(keys)
	for _, k := range keys {
		if w.get(resource, k) == nil {
			cached, _, _ := i.indexer.GetByKey(k)
			evs = append(evs, event{typ: tombstone, obj: cached.(runtime.Object), at: now})
			stats["fault: informer relist: a delete as a tombstone with a stale object"]++
			if n, ok := cached.(*v1.Node); ok && w.s.deletedNodes[k] &&
				slices.ContainsFunc(w.s.deletedInUse[k], func(u string) bool { return !slices.Contains(n.Status.VolumesInUse, v1.UniqueVolumeName(u)) }) {
				stats["fault: informer relist: a node's tombstone without a volume mounted when it went"]++
			}
		}
	}
	for _, o := range w.list(resource) {
		cached, ok, _ := i.indexer.GetByKey(keyOf(o))
		switch {
		case !ok:
			stats["fault: informer relist: an object as an add"]++
		case cached.(object).GetResourceVersion() == o.GetResourceVersion():
			continue
		case cached.(object).GetUID() != o.GetUID():
			stats["fault: informer relist: an object created again as an update with a new UID"]++
		default:
			stats["fault: informer relist: versions skipped in one update"]++
		}
		evs = append(evs, event{typ: replaced, obj: o.DeepCopyObject(), at: now})
	}
	w.pending[resource] = evs
	return stats
}

// resync calls the update handlers with every cached object, as an
// informer's periodic resync does.
func (i *informer) resync() {
	keys := i.indexer.ListKeys()
	slices.Sort(keys)
	for _, k := range keys {
		obj, ok, _ := i.indexer.GetByKey(k)
		if !ok {
			continue
		}
		for _, h := range i.handlers {
			h.OnUpdate(obj, obj)
		}
	}
}
