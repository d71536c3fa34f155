// Package process runs the controller binary itself against a real
// kube-apiserver: start-up, leader election, the HTTP endpoint and shutdown,
// as an operator's Deployment runs it.
package process

import (
	"os"
	"testing"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

var (
	cluster *framework.Cluster
	binary  string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "adc-bin-")
	if err != nil {
		panic(err)
	}
	binary, err = framework.BuildController(dir)
	if err != nil {
		os.RemoveAll(dir)
		panic(err)
	}
	code := framework.Run(m, framework.Options{}, func(c *framework.Cluster) { cluster = c })
	os.RemoveAll(dir)
	os.Exit(code)
}
