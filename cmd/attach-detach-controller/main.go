// Command attach-detach-controller attaches and detaches volumes for the pods
// scheduled to nodes, in place of kube-controller-manager's attachdetach
// controller.
package main

import (
	"os"

	"k8s.io/component-base/cli"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/pkg/server"
)

func main() {
	os.Exit(cli.Run(app.NewCommand(server.NewOptions())))
}
