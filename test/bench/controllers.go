package bench

import (
	"fmt"
	"os"
	"path/filepath"
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
	// the endpoints the controller serves.
	Args func(kubeconfig string, qps float32, burst int) (args []string, ep Endpoints, err error)
	// ReadyLog, for a controller that serves no /readyz, is the log message
	// that says it is ready.
	ReadyLog string
}

// Endpoints are the addresses a controller serves in plain HTTP; empty when
// it serves none.
type Endpoints struct {
	Metrics, Ready string
}

// Ours is this repository's controller.
func Ours(binary string) Controller {
	return Controller{
		Name: "ours", Title: "attach-detach-controller", Binary: binary,
		Args: func(kubeconfig string, qps float32, burst int) ([]string, Endpoints, error) {
			port, err := framework.FreePort()
			if err != nil {
				return nil, Endpoints{}, err
			}
			addr := "127.0.0.1:" + strconv.Itoa(port)
			return []string{
				"--kubeconfig=" + kubeconfig,
				fmt.Sprintf("--kube-api-qps=%g", qps),
				fmt.Sprintf("--kube-api-burst=%d", burst),
				"--leader-elect=false",
				"--secure-port=0",
				"--http-endpoint=" + addr,
			}, Endpoints{Metrics: "http://" + addr + "/metrics", Ready: "http://" + addr + "/readyz"}, nil
		},
	}
}

// KCM is kube-controller-manager running its attachdetach controller only.
// With --secure-port=0 it serves nothing: its requests are counted from the
// apiserver's audit log, as ours are, and it is ready when it logs that its
// informers are synced (the attachdetach controller is the only one that
// waits for them; it then rebuilds its state from the caches and starts).
func KCM(binary string) Controller {
	return Controller{
		Name: "kcm", Title: "kube-controller-manager", Binary: binary,
		ReadyLog: `"Caches are synced"`,
		Args: func(kubeconfig string, qps float32, burst int) ([]string, Endpoints, error) {
			// Its FlexVolume directory is in the run's directory, beside
			// its kubeconfig.
			flexDir := filepath.Join(filepath.Dir(kubeconfig), "kcm-flexvolume")
			if err := os.MkdirAll(flexDir, 0o755); err != nil {
				return nil, Endpoints{}, err
			}
			// The tests' command line, with the API budget of the run, at
			// the default log verbosity (as ours runs).
			return framework.KubeControllerManagerArgs(kubeconfig, flexDir,
				fmt.Sprintf("--kube-api-qps=%g", qps),
				fmt.Sprintf("--kube-api-burst=%d", burst),
				"--v=0",
			), Endpoints{}, nil
		},
	}
}
