package controller

import (
	"slices"
	"testing"
)

func TestRefIndex(t *testing.T) {
	type step struct {
		key      string
		old, new []string
	}
	tests := []struct {
		name  string
		steps []step
		want  map[string][]string
	}{
		{
			name:  "one object, one name",
			steps: []step{{key: "ns/a", new: []string{"ns/c1"}}},
			want:  map[string][]string{"ns/c1": {"ns/a"}, "ns/c2": nil},
		},
		{
			name: "two objects share a name, then one goes",
			steps: []step{
				{key: "ns/a", new: []string{"ns/c1"}},
				{key: "ns/b", new: []string{"ns/c1", "ns/c2"}},
				{key: "ns/a", old: []string{"ns/c1"}},
			},
			want: map[string][]string{"ns/c1": {"ns/b"}, "ns/c2": {"ns/b"}},
		},
		{
			name: "three share a name, then none",
			steps: []step{
				{key: "ns/a", new: []string{"ns/c1"}},
				{key: "ns/b", new: []string{"ns/c1"}},
				{key: "ns/c", new: []string{"ns/c1"}},
				{key: "ns/b", old: []string{"ns/c1"}},
				{key: "ns/a", old: []string{"ns/c1"}},
				{key: "ns/c", old: []string{"ns/c1"}},
			},
			want: map[string][]string{"ns/c1": nil},
		},
		{
			name: "an update moves the object to another name",
			steps: []step{
				{key: "pv-1", new: []string{"ns/c1"}},
				{key: "pv-1", old: []string{"ns/c1"}, new: []string{"ns/c2"}},
			},
			want: map[string][]string{"ns/c1": nil, "ns/c2": {"pv-1"}},
		},
		{
			name: "the same add twice is one entry",
			steps: []step{
				{key: "ns/a", new: []string{"ns/c1"}},
				{key: "ns/b", new: []string{"ns/c1"}},
				{key: "ns/b", new: []string{"ns/c1"}},
				{key: "ns/a", old: []string{"ns/c1"}},
			},
			want: map[string][]string{"ns/c1": {"ns/b"}},
		},
		{
			name: "removing an object that never referred to the name changes nothing",
			steps: []step{
				{key: "ns/a", new: []string{"ns/c1"}},
				{key: "ns/b", old: []string{"ns/c1"}},
			},
			want: map[string][]string{"ns/c1": {"ns/a"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newRefIndex()
			for _, s := range tt.steps {
				x.update(s.key, s.old, s.new)
			}
			for name, want := range tt.want {
				got := x.get(name)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Errorf("get(%s) = %v, want %v", name, got, want)
				}
			}
			// Nothing is left of a name no object refers to.
			for name, want := range tt.want {
				_, one := x.one[name]
				_, many := x.many[name]
				if len(want) == 0 && (one || many) {
					t.Errorf("%s still held: one=%v many=%v", name, one, many)
				}
				if len(want) == 1 && many {
					t.Errorf("%s held as many for one key", name)
				}
			}
		})
	}
}
