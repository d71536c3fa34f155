package server

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	netutils "k8s.io/utils/net"
)

// DefaultPort is the default --secure-port.
const DefaultPort = 10262

// RequestTimeout bounds the time a request may take once its headers are
// read; the TLS server bounds header reads (32s), idle connections (90s)
// and header size (1 MiB).
const RequestTimeout = 30 * time.Second

// Options are the flags of the secure endpoint, named, typed and
// defaulted as kube-controller-manager's (k8s.io/apiserver's
// SecureServingOptions, DelegatingAuthenticationOptions and
// DelegatingAuthorizationOptions).
type Options struct {
	// Serving.
	BindAddress                  net.IP
	BindPort                     int
	DisableHTTP2                 bool
	CertDirectory                string
	PairName                     string
	CertFile                     string
	KeyFile                      string
	CipherSuites                 []string
	CurvePreferences             []int32
	MinTLSVersion                string
	SNICertKeys                  []cliflag.NamedCertKey
	HTTP2MaxStreamsPerConnection int
	PermitPortSharing            bool
	PermitAddressSharing         bool
	// Listener, when set, is served instead of BindAddress:BindPort.
	Listener net.Listener

	// Delegated authentication.
	AuthenticationKubeconfig       string
	TokenCacheTTL                  time.Duration
	ClientCAFile                   string
	RequestHeader                  RequestHeaderOptions
	SkipInClusterLookup            bool
	TolerateInClusterLookupFailure bool

	// Delegated authorization.
	AuthorizationKubeconfig string
	AllowCacheTTL           time.Duration
	DenyCacheTTL            time.Duration
	AlwaysAllowPaths        []string
	// AlwaysAllowGroups are authorized without a SubjectAccessReview (no
	// flag): the kube-apiserver's own authorizer allows them everything.
	AlwaysAllowGroups []string
}

// RequestHeaderOptions are the front proxy's flags (--requestheader-*).
type RequestHeaderOptions struct {
	ClientCAFile        string
	AllowedNames        []string
	UsernameHeaders     []string
	UIDHeaders          []string
	GroupHeaders        []string
	ExtraHeaderPrefixes []string
}

// NewOptions returns kube-controller-manager's defaults, with this
// controller's port and certificate name; the certificate is generated in
// memory when none is given.
func NewOptions() *Options {
	return &Options{
		BindAddress: netutils.ParseIPSloppy("0.0.0.0"),
		BindPort:    DefaultPort,
		PairName:    "attach-detach-controller",

		TokenCacheTTL: 10 * time.Second,
		RequestHeader: RequestHeaderOptions{
			UsernameHeaders:     []string{"x-remote-user"},
			GroupHeaders:        []string{"x-remote-group"},
			ExtraHeaderPrefixes: []string{"x-remote-extra-"},
		},

		AllowCacheTTL:     10 * time.Second,
		DenyCacheTTL:      10 * time.Second,
		AlwaysAllowPaths:  []string{"/healthz", "/readyz", "/livez"},
		AlwaysAllowGroups: []string{"system:masters"},
	}
}

// AddFlags binds the options to fs, with kube-controller-manager's names
// and help.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IPVar(&o.BindAddress, "bind-address", o.BindAddress, ""+
		"The IP address on which to listen for the --secure-port port. The "+
		"associated interface(s) must be reachable by the rest of the cluster, and by CLI/web "+
		"clients. If blank or an unspecified address (0.0.0.0 or ::), all interfaces and IP address families will be used.")
	fs.IntVar(&o.BindPort, "secure-port", o.BindPort,
		"The port on which to serve HTTPS with authentication and authorization. If 0, don't serve HTTPS at all.")
	fs.BoolVar(&o.DisableHTTP2, "disable-http2-serving", o.DisableHTTP2,
		"If true, HTTP2 serving will be disabled [default=false]")
	fs.StringVar(&o.CertDirectory, "cert-dir", o.CertDirectory, ""+
		"The directory where the TLS certs are located. "+
		"If --tls-cert-file and --tls-private-key-file are provided, this flag will be ignored.")
	fs.StringVar(&o.CertFile, "tls-cert-file", o.CertFile, ""+
		"File containing the default x509 Certificate for HTTPS. (CA cert, if any, concatenated "+
		"after server cert). If HTTPS serving is enabled, and --tls-cert-file and "+
		"--tls-private-key-file are not provided, a self-signed certificate and key "+
		"are generated for the public address and saved to the directory specified by --cert-dir.")
	fs.StringVar(&o.KeyFile, "tls-private-key-file", o.KeyFile,
		"File containing the default x509 private key matching --tls-cert-file.")
	fs.StringSliceVar(&o.CipherSuites, "tls-cipher-suites", o.CipherSuites,
		"Comma-separated list of cipher suites for the server. "+
			"If omitted, the default Go cipher suites will be used. \n"+
			"Preferred values: "+strings.Join(cliflag.PreferredTLSCipherNames(), ", ")+". \n"+
			"Insecure values: "+strings.Join(cliflag.InsecureTLSCipherNames(), ", ")+".")
	fs.Int32SliceVar(&o.CurvePreferences, "tls-curve-preferences", o.CurvePreferences,
		"Comma-separated list of numeric Go crypto/tls CurveID values, "+
			"as the allowed key exchange mechanisms for the server. "+
			"The supported values depend on the Go version used. "+
			"See https://pkg.go.dev/crypto/tls#CurveID for values supported for each Go version. "+
			"The order of the list is ignored, and key exchange mechanisms are chosen "+
			"by Go from this list using an internal preference order. "+
			"If omitted, the default Go curves will be used.")
	fs.StringVar(&o.MinTLSVersion, "tls-min-version", o.MinTLSVersion,
		"Minimum TLS version supported. Possible values: "+strings.Join(cliflag.TLSPossibleVersions(), ", "))
	fs.Var(cliflag.NewNamedCertKeyArray(&o.SNICertKeys), "tls-sni-cert-key", ""+
		"A pair of x509 certificate and private key file paths, optionally suffixed with a list of "+
		"domain patterns which are fully qualified domain names, possibly with prefixed wildcard "+
		"segments. The domain patterns also allow IP addresses, but IPs should only be used if "+
		"the apiserver has visibility to the IP address requested by a client. "+
		"If no domain patterns are provided, the names of the certificate are "+
		"extracted. Non-wildcard matches trump over wildcard matches, explicit domain patterns "+
		"trump over extracted names. For multiple key/certificate pairs, use the "+
		"--tls-sni-cert-key multiple times. "+
		"Examples: \"example.crt,example.key\" or \"foo.crt,foo.key:*.foo.com,foo.com\".")
	fs.IntVar(&o.HTTP2MaxStreamsPerConnection, "http2-max-streams-per-connection", o.HTTP2MaxStreamsPerConnection, ""+
		"The limit that the server gives to clients for "+
		"the maximum number of streams in an HTTP/2 connection. "+
		"Zero means to use golang's default.")
	fs.BoolVar(&o.PermitPortSharing, "permit-port-sharing", o.PermitPortSharing,
		"If true, SO_REUSEPORT will be used when binding the port, which allows "+
			"more than one instance to bind on the same address and port. [default=false]")
	fs.BoolVar(&o.PermitAddressSharing, "permit-address-sharing", o.PermitAddressSharing,
		"If true, SO_REUSEADDR will be used when binding the port. This allows binding "+
			"to wildcard IPs like 0.0.0.0 and specific IPs in parallel, and it avoids waiting "+
			"for the kernel to release sockets in TIME_WAIT state. [default=false]")

	optional := " This is optional. If empty, all token requests are considered to be anonymous and no client CA is looked up in the cluster."
	fs.StringVar(&o.AuthenticationKubeconfig, "authentication-kubeconfig", o.AuthenticationKubeconfig, ""+
		"kubeconfig file pointing at the 'core' kubernetes server with enough rights to create "+
		"tokenreviews.authentication.k8s.io."+optional)
	fs.DurationVar(&o.TokenCacheTTL, "authentication-token-webhook-cache-ttl", o.TokenCacheTTL,
		"The duration to cache responses from the webhook token authenticator.")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, ""+
		"If set, any request presenting a client certificate signed by one of "+
		"the authorities in the client-ca-file is authenticated with an identity "+
		"corresponding to the CommonName of the client certificate.")
	rh := &o.RequestHeader
	fs.StringSliceVar(&rh.UsernameHeaders, "requestheader-username-headers", rh.UsernameHeaders, ""+
		"List of request headers to inspect for usernames. X-Remote-User is common.")
	fs.StringSliceVar(&rh.UIDHeaders, "requestheader-uid-headers", rh.UIDHeaders, ""+
		"List of request headers to inspect for UIDs. X-Remote-Uid is suggested. Requires the RemoteRequestHeaderUID feature to be enabled.")
	fs.StringSliceVar(&rh.GroupHeaders, "requestheader-group-headers", rh.GroupHeaders, ""+
		"List of request headers to inspect for groups. X-Remote-Group is suggested.")
	fs.StringSliceVar(&rh.ExtraHeaderPrefixes, "requestheader-extra-headers-prefix", rh.ExtraHeaderPrefixes, ""+
		"List of request header prefixes to inspect. X-Remote-Extra- is suggested.")
	fs.StringVar(&rh.ClientCAFile, "requestheader-client-ca-file", rh.ClientCAFile, ""+
		"Root certificate bundle to use to verify client certificates on incoming requests "+
		"before trusting usernames in headers specified by --requestheader-username-headers. "+
		"WARNING: generally do not depend on authorization being already done for incoming requests.")
	fs.StringSliceVar(&rh.AllowedNames, "requestheader-allowed-names", rh.AllowedNames, ""+
		"List of client certificate common names to allow to provide usernames in headers "+
		"specified by --requestheader-username-headers. If empty, any client certificate validated "+
		"by the authorities in --requestheader-client-ca-file is allowed.")
	fs.BoolVar(&o.SkipInClusterLookup, "authentication-skip-lookup", o.SkipInClusterLookup, ""+
		"If false, the authentication-kubeconfig will be used to lookup missing authentication "+
		"configuration from the cluster.")
	fs.BoolVar(&o.TolerateInClusterLookupFailure, "authentication-tolerate-lookup-failure", o.TolerateInClusterLookupFailure, ""+
		"If true, failures to look up missing authentication configuration from the cluster are not considered fatal. "+
		"Note that this can result in authentication that treats all requests as anonymous.")

	fs.StringVar(&o.AuthorizationKubeconfig, "authorization-kubeconfig", o.AuthorizationKubeconfig, ""+
		"kubeconfig file pointing at the 'core' kubernetes server with enough rights to create "+
		"subjectaccessreviews.authorization.k8s.io. This is optional. If empty, all requests not skipped by authorization are forbidden.")
	fs.DurationVar(&o.AllowCacheTTL, "authorization-webhook-cache-authorized-ttl", o.AllowCacheTTL,
		"The duration to cache 'authorized' responses from the webhook authorizer.")
	fs.DurationVar(&o.DenyCacheTTL, "authorization-webhook-cache-unauthorized-ttl", o.DenyCacheTTL,
		"The duration to cache 'unauthorized' responses from the webhook authorizer.")
	fs.StringSliceVar(&o.AlwaysAllowPaths, "authorization-always-allow-paths", o.AlwaysAllowPaths,
		"A list of HTTP paths to skip during authorization, i.e. these are authorized without "+
			"contacting the 'core' kubernetes server.")
}

// Validate refuses inconsistent values, as kube-controller-manager does.
func (o *Options) Validate() []error {
	var errs []error
	if o.BindPort < 0 || o.BindPort > 65535 {
		errs = append(errs, fmt.Errorf("--secure-port %v must be between 0 and 65535, inclusive. 0 for turning off secure port", o.BindPort))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, fmt.Errorf("--tls-cert-file and --tls-private-key-file must be given together"))
	}
	if _, err := cliflag.TLSCipherSuites(o.CipherSuites); err != nil {
		errs = append(errs, fmt.Errorf("--tls-cipher-suites: %w", err))
	}
	if _, err := cliflag.TLSVersion(o.MinTLSVersion); err != nil {
		errs = append(errs, fmt.Errorf("--tls-min-version: %w", err))
	}
	if o.HTTP2MaxStreamsPerConnection < 0 {
		errs = append(errs, fmt.Errorf("--http2-max-streams-per-connection must be non-negative"))
	}
	errs = append(errs, o.RequestHeader.validate()...)
	for _, p := range o.AlwaysAllowPaths {
		if i := strings.Index(p, "*"); i >= 0 && i != len(p)-1 {
			errs = append(errs, fmt.Errorf("--authorization-always-allow-paths: only trailing * allowed in %q", p))
		}
	}
	return errs
}

func (rh *RequestHeaderOptions) validate() []error {
	var errs []error
	for flag, values := range map[string][]string{
		"--requestheader-username-headers":     rh.UsernameHeaders,
		"--requestheader-uid-headers":          rh.UIDHeaders,
		"--requestheader-group-headers":        rh.GroupHeaders,
		"--requestheader-extra-headers-prefix": rh.ExtraHeaderPrefixes,
		"--requestheader-allowed-names":        rh.AllowedNames,
	} {
		for _, v := range values {
			if strings.TrimSpace(v) == "" {
				errs = append(errs, fmt.Errorf("empty value in %q", flag))
				break
			}
		}
	}
	return errs
}
