package bench

import (
	"fmt"
	"strconv"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Controller is one controller under test.
type Controller struct {
	// Name is short: it names the service account, the objects and the
	// files of the run ("ours", "kcm").
	Name   string
	Title  string
	Binary string
	// Args returns the command line for a kubeconfig and API budget, and
	// the address of /metrics, if the controller serves one.
	Args func(kubeconfig string, qps float32, burst int) (args []string, metricsURL string, err error)
}

// Ours is this repository's controller.
func Ours(binary string) Controller {
	return Controller{
		Name: "ours", Title: "attach-detach-controller", Binary: binary,
		Args: func(kubeconfig string, qps float32, burst int) ([]string, string, error) {
			port, err := framework.FreePort()
			if err != nil {
				return nil, "", err
			}
			addr := "127.0.0.1:" + strconv.Itoa(port)
			return []string{
				"--kubeconfig=" + kubeconfig,
				fmt.Sprintf("--kube-api-qps=%g", qps),
				fmt.Sprintf("--kube-api-burst=%d", burst),
				"--leader-elect=false",
				"--secure-port=0",
				"--http-endpoint=" + addr,
			}, "http://" + addr + "/metrics", nil
		},
	}
}

// KCM is kube-controller-manager running its attachdetach controller only.
// With --secure-port=0 it serves nothing: its requests are counted from the
// apiserver's audit log, as ours are.
func KCM(binary string) Controller {
	return Controller{
		Name: "kcm", Title: "kube-controller-manager", Binary: binary,
		Args: func(kubeconfig string, qps float32, burst int) ([]string, string, error) {
			return []string{
				"--controllers=attachdetach",
				"--leader-elect=false",
				"--secure-port=0",
				"--use-service-account-credentials=false",
				"--kubeconfig=" + kubeconfig,
				fmt.Sprintf("--kube-api-qps=%g", qps),
				fmt.Sprintf("--kube-api-burst=%d", burst),
			}, "", nil
		},
	}
}
