package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		APIGroup    string `json:"apiGroup"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// permission is a verb on a resource ("nodes/status") of an API group.
type permission struct {
	group, resource, verb string
}

func (p permission) String() string {
	return fmt.Sprintf("%s %s.%s", p.verb, p.resource, p.group)
}

func (e auditEvent) permission() (permission, bool) {
	if e.ObjectRef == nil {
		return permission{}, false // a non-resource URL (discovery)
	}
	res := e.ObjectRef.Resource
	if e.ObjectRef.Subresource != "" {
		res += "/" + e.ObjectRef.Subresource
	}
	return permission{e.ObjectRef.APIGroup, res, e.Verb}, true
}

func (e auditEvent) forbidden() bool {
	return e.ResponseStatus != nil && e.ResponseStatus.Code == 403
}

// auditOffset is where the next request's audit events will start.
func auditOffset(t *testing.T) int64 {
	t.Helper()
	info, err := os.Stat(auditLog)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// controllerRequests returns the audit events of the controller's service
// account written since offset (whole lines only).
func controllerRequests(t *testing.T, offset int64) []auditEvent {
	t.Helper()
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	var events []auditEvent
	for line := range bytes.Lines(data) {
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("audit log line %q: %v", line, err)
		}
		if e.User.Username == controllerUser {
			events = append(events, e)
		}
	}
	return events
}

// forbiddenCount counts the refused requests for p among events.
func forbiddenCount(events []auditEvent, p permission) int {
	n := 0
	for _, e := range events {
		if got, ok := e.permission(); ok && got == p && e.forbidden() && e.Stage == "ResponseComplete" {
			n++
		}
	}
	return n
}

// grants lists the permissions rules grant, one per verb and resource.
func grants(rules []rbacv1.PolicyRule) []permission {
	var out []permission
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, permission{g, res, v})
				}
			}
		}
	}
	return out
}

// withoutVerb returns rules with verb removed from the rule granting it on
// resource.
func withoutVerb(rules []rbacv1.PolicyRule, resource, verb string) ([]rbacv1.PolicyRule, bool) {
	removed := false
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		r = *r.DeepCopy()
		if slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			removed = true
			if len(r.Resources) > 1 {
				// Keep the verb for the rule's other resources.
				other := *r.DeepCopy()
				other.Resources = slices.DeleteFunc(other.Resources, func(s string) bool { return s == resource })
				out = append(out, other)
				r.Resources = []string{resource}
			}
			r.Verbs = slices.DeleteFunc(r.Verbs, func(s string) bool { return s == verb })
			if len(r.Verbs) == 0 {
				continue
			}
		}
		out = append(out, r)
	}
	return out, removed
}
