package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"os/signal"
	"syscall"
)

// Version is stamped at build time with -ldflags "-X ...app.Version=...".
var Version = "dev"

// NewCommand returns the root command; it serves the secure endpoint of
// serving (pkg/server.NewOptions: --secure-port and the flags beside it), as
// kube-controller-manager does, when not nil.
func NewCommand(serving SecureServing) *cobra.Command {
	o := NewOptions()
	o.Serving = serving
	gate := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gate); err != nil {
		panic(err) // only fails on a duplicate gate: a programming error
	}
	cmd := &cobra.Command{
		Use:          "attach-detach-controller",
		Short:        "Attaches and detaches volumes for the pods scheduled to nodes",
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.ShowVersion {
				fmt.Fprintln(cmd.OutOrStdout(), "attach-detach-controller", Version)
				return nil
			}
			if err := o.Validate(gate); err != nil {
				return err
			}
			if err := logsapi.ValidateAndApply(o.Logs, gate); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return RunProcess(ctx, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func durationOf(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

var errLeaseLost = errors.New("leader election lost")

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
