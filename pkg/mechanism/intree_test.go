package mechanism

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// fakePlugin records its calls and answers with err (nil: success).
type fakePlugin struct {
	name  string
	err   error
	calls []string
}

var _ intree.Plugin = (*fakePlugin)(nil)

func (p *fakePlugin) Name() string { return p.name }

func (p *fakePlugin) Attach(_ context.Context, spec *volume.Spec, node string) (string, error) {
	p.calls = append(p.calls, "attach "+string(spec.Name)+"@"+node)
	if p.err != nil {
		return "", p.err
	}
	return "/dev/sdb", nil
}

func (p *fakePlugin) Detach(_ context.Context, name volume.Name, node string) error {
	p.calls = append(p.calls, "detach "+string(name)+"@"+node)
	return p.err
}

func TestInTree(t *testing.T) {
	const iscsi = volume.Name("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0")
	spec := &volume.Spec{Name: iscsi, Kind: volume.KindInTree, PluginName: volume.ISCSIPluginName}
	ebs := &volume.Spec{Name: "kubernetes.io/aws-ebs/vol-1", Kind: volume.KindInTree, PluginName: "kubernetes.io/aws-ebs"}
	tests := []struct {
		name       string
		pluginErr  error
		attach     *volume.Spec
		detach     *cache.Attachment
		want       reconciler.AttachResult
		wantDone   bool
		wantErr    string
		wantCalls  []string
		wantNoAttc bool // the error is an *intree.NoAttacherError
	}{
		{name: "attach", attach: spec, want: reconciler.AttachResult{Attached: true, DevicePath: "/dev/sdb"},
			wantCalls: []string{"attach " + string(iscsi) + "@node-1"}},
		{name: "attach fails", attach: spec, pluginErr: errors.New("no route"), wantErr: "no route",
			wantCalls: []string{"attach " + string(iscsi) + "@node-1"}},
		{name: "attach with no plugin", attach: ebs, wantNoAttc: true,
			wantErr: "node node-1: in-tree plugin kubernetes.io/aws-ebs has no attacher in this build: install its CSI driver and migrate the node"},
		{name: "detach", detach: &cache.Attachment{Key: cache.Key{Volume: iscsi, Node: "node-1"}, PluginName: volume.ISCSIPluginName},
			wantDone: true, wantCalls: []string{"detach " + string(iscsi) + "@node-1"}},
		{name: "detach of a recovered attachment: plugin from the name", detach: &cache.Attachment{Key: cache.Key{Volume: iscsi, Node: "node-1"}},
			wantDone: true, wantCalls: []string{"detach " + string(iscsi) + "@node-1"}},
		{name: "detach fails", pluginErr: errors.New("busy"), detach: &cache.Attachment{Key: cache.Key{Volume: iscsi, Node: "node-1"}},
			wantErr: "busy", wantCalls: []string{"detach " + string(iscsi) + "@node-1"}},
		{name: "detach with no plugin", detach: &cache.Attachment{Key: cache.Key{Volume: ebs.Name, Node: "node-1"}}, wantNoAttc: true,
			wantErr: "in-tree plugin kubernetes.io/aws-ebs has no attacher in this build: install its CSI driver and migrate the node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakePlugin{name: volume.ISCSIPluginName, err: tt.pluginErr}
			m := NewInTree(intree.NewRegistry(p))
			var err error
			if tt.attach != nil {
				var got reconciler.AttachResult
				got, err = m.Attach(context.Background(), tt.attach, "node-1")
				if got != tt.want {
					t.Errorf("Attach = %+v, want %+v", got, tt.want)
				}
			} else {
				var done bool
				done, err = m.Detach(context.Background(), *tt.detach)
				if done != tt.wantDone {
					t.Errorf("Detach done = %v, want %v", done, tt.wantDone)
				}
			}
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Errorf("error %q, want %q", gotErr, tt.wantErr)
			}
			var na *intree.NoAttacherError
			if errors.As(err, &na) != tt.wantNoAttc {
				t.Errorf("error %v is a NoAttacherError: %v, want %v", err, !tt.wantNoAttc, tt.wantNoAttc)
			}
			var notAttached *reconciler.NotAttachedError
			if wantNA := tt.wantNoAttc && tt.attach != nil; errors.As(err, &notAttached) != wantNA {
				t.Errorf("error %v says nothing was attached: %v, want %v", err, !wantNA, wantNA)
			}
			if !reflect.DeepEqual(p.calls, tt.wantCalls) {
				t.Errorf("plugin calls %q, want %q", p.calls, tt.wantCalls)
			}
		})
	}
}

// Nothing shows what became of an in-tree detach of unknown outcome: the
// volume is attached again (never detached), with the spec of the pod that
// wants it, or the one it was attached with.
func TestInTreeSettle(t *testing.T) {
	const iscsi = volume.Name("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0")
	spec := &volume.Spec{Name: iscsi, Kind: volume.KindInTree, PluginName: volume.ISCSIPluginName}
	a := cache.Attachment{Key: cache.Key{Volume: iscsi, Node: "node-1"}, PluginName: volume.ISCSIPluginName}
	withSpec := a
	withSpec.Spec = spec
	for _, tt := range []struct {
		name      string
		a         cache.Attachment
		spec      *volume.Spec
		pluginErr error
		want      reconciler.Settled
		wantErr   string
		wantCalls []string
	}{
		{name: "attached again", a: a, spec: spec, want: reconciler.Settled{Attached: true, DevicePath: "/dev/sdb"},
			wantCalls: []string{"attach " + string(iscsi) + "@node-1"}},
		{name: "with the spec on record", a: withSpec, want: reconciler.Settled{Attached: true, DevicePath: "/dev/sdb"},
			wantCalls: []string{"attach " + string(iscsi) + "@node-1"}},
		{name: "attach fails", a: a, spec: spec, pluginErr: errors.New("no route"), wantErr: "no route",
			wantCalls: []string{"attach " + string(iscsi) + "@node-1"}},
		{name: "no spec", a: a, wantErr: "volume " + string(iscsi) + ": no spec to attach it again with"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &fakePlugin{name: volume.ISCSIPluginName, err: tt.pluginErr}
			got, err := NewInTree(intree.NewRegistry(p)).Settle(context.Background(), tt.a, tt.spec)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if got != tt.want || gotErr != tt.wantErr {
				t.Errorf("Settle = %+v, %q; want %+v, %q", got, gotErr, tt.want, tt.wantErr)
			}
			if !reflect.DeepEqual(p.calls, tt.wantCalls) {
				t.Errorf("plugin calls %q, want %q", p.calls, tt.wantCalls)
			}
		})
	}
}
