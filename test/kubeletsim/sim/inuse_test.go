package sim

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

func attached(names ...string) []v1.AttachedVolume {
	var out []v1.AttachedVolume
	for _, n := range names {
		out = append(out, v1.AttachedVolume{Name: v1.UniqueVolumeName(n)})
	}
	return out
}

func unique(names ...string) []v1.UniqueVolumeName {
	var out []v1.UniqueVolumeName
	for _, n := range names {
		out = append(out, v1.UniqueVolumeName(n))
	}
	return out
}

func TestInUse(t *testing.T) {
	tests := []struct {
		name             string
		attached         []v1.AttachedVolume
		used             []string
		reportUnattached bool
		want             []v1.UniqueVolumeName
	}{
		{name: "nothing"},
		{name: "attached, no pod: unmounted", attached: attached("a")},
		{name: "used, not attached: waits for attach", used: []string{"a"}},
		{name: "attached and used", attached: attached("a", "b"), used: []string{"a", "c"}, want: unique("a")},
		{name: "sorted", attached: attached("kubernetes.io/csi/d^2", "kubernetes.io/csi/d^10", "kubernetes.io/aws-ebs/x"),
			used: []string{"kubernetes.io/csi/d^2", "kubernetes.io/csi/d^10", "kubernetes.io/aws-ebs/x"},
			want: unique("kubernetes.io/aws-ebs/x", "kubernetes.io/csi/d^10", "kubernetes.io/csi/d^2")},
		{name: "duplicate attachments reported once", attached: attached("a", "a"), used: []string{"a"}, want: unique("a")},
		{name: "names must match exactly", attached: attached("kubernetes.io/aws-ebs/vol-1"), used: []string{"kubernetes.io/csi/ebs.csi.aws.com^vol-1"}},
		{name: "report unattached: every used volume", attached: attached("b"), used: []string{"c", "a"}, reportUnattached: true, want: unique("a", "c")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := InUse(tc.attached, sets.New(tc.used...), tc.reportUnattached)
			if !slices.Equal(got, tc.want) {
				t.Errorf("InUse = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSameVolumes(t *testing.T) {
	tests := []struct {
		a, b []v1.UniqueVolumeName
		want bool
	}{
		{nil, nil, true},
		{nil, unique(), true},
		{unique("a", "b"), unique("b", "a"), true},
		{unique("a", "a"), unique("a"), true},
		{unique("a"), unique("a", "b"), false},
		{unique("a"), nil, false},
	}
	for _, tc := range tests {
		if got := sameVolumes(tc.a, tc.b); got != tc.want {
			t.Errorf("sameVolumes(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
