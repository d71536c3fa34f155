// Package app is kubectl-adc: `why` asks the leading attach-detach-controller
// (its /explain, with the user's own credentials) why a pod's, a
// PersistentVolume's or a node's volumes are or are not attached, and reads
// the same chain from the objects when the controller can't be reached:
// pod -> claim -> PersistentVolume -> VolumeAttachment -> node status ->
// CSINode, saying what only the controller knows.
//
// The controller is reached through a port-forward to the pod holding its
// Lease, set up through the API server with the user's kubeconfig (RBAC:
// pods/portforward in the controller's namespace), or at --endpoint. The
// API server's service proxy is no way to reach it: the API server drops
// the caller's credentials before proxying, and the controller answers
// /explain only to callers it can authenticate and authorize (get /explain).
package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Version is stamped at build time (-ldflags -X, from VERSION).
var Version = "dev"

// Options are the flags of kubectl-adc.
type Options struct {
	loading   *clientcmd.ClientConfigLoadingRules
	overrides *clientcmd.ConfigOverrides

	// Where the controller runs: its namespace, Lease and secure port.
	ControllerNamespace string
	LeaseName           string
	Port                int
	// Endpoint, when set, is the controller's secure endpoint (https://...),
	// reached directly instead of through a port-forward.
	Endpoint string
	// EndpointCA verifies Endpoint's certificate; without it
	// InsecureEndpoint must be set (the controller's certificate is
	// self-signed unless it was given one).
	EndpointCA       string
	InsecureEndpoint bool
	// ClientSide skips the controller: the answer comes from the objects.
	ClientSide bool
	Timeout    time.Duration
}

// NewCommand returns the kubectl-adc command, writing answers to out and
// errors to errOut.
func NewCommand(out, errOut io.Writer) *cobra.Command {
	o := &Options{
		loading:             clientcmd.NewDefaultClientConfigLoadingRules(),
		overrides:           &clientcmd.ConfigOverrides{},
		ControllerNamespace: "kube-system",
		LeaseName:           "attach-detach-controller",
		Port:                10262,
		Timeout:             30 * time.Second,
	}
	root := &cobra.Command{
		Use:           "kubectl-adc",
		Short:         "Ask the attach-detach-controller why volumes are (not) attached",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	fs := root.PersistentFlags()
	fs.StringVar(&o.loading.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use.")
	clientcmd.BindOverrideFlags(o.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	fs.StringVar(&o.ControllerNamespace, "controller-namespace", o.ControllerNamespace, "Namespace of the controller and its Lease.")
	fs.StringVar(&o.LeaseName, "lease", o.LeaseName, "Name of the controller's Lease (--leader-elect-resource-name).")
	fs.IntVar(&o.Port, "port", o.Port, "The controller's --secure-port, reached through a port-forward to the leader.")
	fs.StringVar(&o.Endpoint, "endpoint", "", "The controller's secure endpoint (https://host:port), reached directly instead of through a port-forward.")
	fs.StringVar(&o.EndpointCA, "endpoint-ca", "", "CA certificate file that verifies --endpoint.")
	fs.BoolVar(&o.InsecureEndpoint, "endpoint-insecure-skip-tls-verify", false, "Do not verify --endpoint's certificate (the controller's is self-signed unless it was given one).")
	fs.BoolVar(&o.ClientSide, "client-side", false, "Do not ask the controller: answer from the objects only.")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "How long to wait for the API server and the controller.")

	why := &cobra.Command{
		Use:   "why (pod/NAME | pv/NAME | node/NAME)",
		Short: "Why is this pod's, volume's or node's volume (not) attached?",
		Long: `Asks the leading attach-detach-controller (its /explain) why volumes are or
are not attached, through a port-forward to the pod holding its Lease, with
your kubeconfig's credentials: you need pods/portforward in the controller's
namespace and get on the non-resource URL /explain (the ClusterRole
attach-detach-controller:explain). When the controller can't be reached, the
answer is read from the objects (claim, PersistentVolume, VolumeAttachment,
node status, CSINode), and says what only the controller knows.`,
		Example: `  kubectl adc why pod/web-0 -n shop
  kubectl adc why pv/pvc-0a1b2c
  kubectl adc why node/worker-3
  kubectl adc why pod/web-0 -n shop --endpoint https://127.0.0.1:10262 --endpoint-insecure-skip-tls-verify`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.Timeout)
			defer cancel()
			return o.why(ctx, cmd.OutOrStdout(), t)
		},
	}
	root.AddCommand(why)
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "kubectl-adc", Version)
		},
	})
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w\nSee '%s --help'", err, c.CommandPath())
	})
	return root
}

// clients are what why needs of the user's kubeconfig.
type clients struct {
	config    *rest.Config
	client    kubernetes.Interface
	namespace string
}

func (o *Options) clients() (*clients, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(o.loading, o.overrides)
	config, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	config = rest.CopyConfig(config)
	config.UserAgent = "kubectl-adc/" + Version
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &clients{config: config, client: client, namespace: ns}, nil
}
