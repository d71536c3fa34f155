package app

import (
	"fmt"
	"strings"
)

// kind is what `why` is asked about.
type kind string

const (
	kindPod  kind = "pod"
	kindPV   kind = "pv"
	kindNode kind = "node"
)

// target is the object of a `why`: KIND/NAME, or NAME for a pod.
type target struct {
	kind kind
	name string
}

var kindAliases = map[string]kind{
	"pod": kindPod, "pods": kindPod, "po": kindPod,
	"pv": kindPV, "pvs": kindPV, "persistentvolume": kindPV, "persistentvolumes": kindPV,
	"node": kindNode, "nodes": kindNode, "no": kindNode,
}

func parseTarget(s string) (target, error) {
	k, name, found := strings.Cut(s, "/")
	if !found {
		k, name = "pod", s
	}
	t, ok := kindAliases[strings.ToLower(k)]
	if !ok || name == "" || strings.Contains(name, "/") {
		return target{}, fmt.Errorf("want pod/NAME, pv/NAME or node/NAME, got %q", s)
	}
	return target{kind: t, name: name}, nil
}
