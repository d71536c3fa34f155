// Command kustomize renders a kustomization: `kustomize build DIR` (or
// `kustomize DIR`) writes the objects as YAML to stdout. It runs the same code
// as `kubectl kustomize` of the pinned kubectl (sigs.k8s.io/kustomize's build
// command, at the version k8s.io/kubectl pins in go.mod) without building all
// of kubectl: hack/verify-manifests.sh and test/integration/deploy use it.
package main

import (
	"os"

	"sigs.k8s.io/kustomize/kustomize/v5/commands/build"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "build" {
		args = args[1:]
	}
	cmd := build.NewCmdBuild(filesys.MakeFsOnDisk(), build.MakeHelp("kustomize", "build"), os.Stdout)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		os.Exit(1) // cobra has printed the error
	}
}
