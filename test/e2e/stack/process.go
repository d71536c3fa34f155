package stack

import "github.com/kube-attach/attach-detach-controller/test/framework"

// Process is one component of the stack, its log in the stack's directory.
type Process = framework.Process
