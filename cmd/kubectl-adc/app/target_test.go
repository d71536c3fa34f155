package app

import "testing"

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want target
		err  bool
	}{
		{in: "web-0", want: target{kindPod, "web-0"}},
		{in: "pod/web-0", want: target{kindPod, "web-0"}},
		{in: "po/web-0", want: target{kindPod, "web-0"}},
		{in: "pv/pvc-1", want: target{kindPV, "pvc-1"}},
		{in: "persistentvolumes/pvc-1", want: target{kindPV, "pvc-1"}},
		{in: "Node/worker-3", want: target{kindNode, "worker-3"}},
		{in: "pvc/data", err: true},
		{in: "pod/", err: true},
		{in: "pod/a/b", err: true},
	} {
		got, err := parseTarget(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseTarget(%q) = %+v, %v; want %+v, error %t", tc.in, got, err, tc.want, tc.err)
		}
	}
}
