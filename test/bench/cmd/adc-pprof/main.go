// Command adc-pprof is attach-detach-controller with net/http/pprof served on
// $ADC_PPROF_ADDR (host:port), to profile the controller under the benchmark
// (adcbench -ours-binary) without touching its code. Nothing else differs.
package main

import (
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on http.DefaultServeMux
	"os"
	"time"

	"k8s.io/component-base/cli"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/pkg/server"
)

func main() {
	if addr := os.Getenv("ADC_PPROF_ADDR"); addr != "" {
		srv := &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.ListenAndServe() }()
	}
	os.Exit(cli.Run(app.NewCommand(server.NewOptions())))
}
