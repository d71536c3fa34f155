// Command kubectl-adc is the attach-detach-controller's kubectl plugin:
// `kubectl adc why pod/NAME` asks the leading controller why the pod's
// volumes are (not) attached, and answers from the objects when the
// controller can't be reached. Install it by copying the binary onto the
// PATH, or with krew (plugins/adc.yaml).
package main

import (
	"fmt"
	"os"

	"github.com/kube-attach/attach-detach-controller/cmd/kubectl-adc/app"
)

func main() {
	if err := app.NewCommand(os.Stdout, os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
