// Command go-dra-driver is an example DRA driver that delegates to nri-accel: it publishes some
// of nri-accel's devices in a ResourceSlice pool under its own driver name (gpu.example.com by
// default) and forwards the kubelet's NodePrepareResources and NodeUnprepareResources calls to
// nri-accel's claims API through the Go client, so nri-accel stays the one arbiter of the node's
// devices whichever driver a claim came through. It is built on the upstream kubelet plugin
// helper (k8s.io/dynamic-resource-allocation/kubeletplugin), as DRA drivers in the field are.
// It is an example: nri-accel's packaging does not ship it. README.md says how to build and run
// it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"nri-accel/clients/go/claims"
)

// flags are the driver's settings.
type flags struct {
	driverName   string
	nodeName     string
	kubeconfig   string
	claimsSocket string
	devices      string
	pluginsDir   string
	registryDir  string
	callTimeout  time.Duration
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("go-dra-driver", flag.ContinueOnError)
	fs.StringVar(&f.driverName, "driver-name", "gpu.example.com", "the DRA driver name this driver registers and publishes under")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name in Kubernetes (default $NODE_NAME)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "the kubeconfig to reach the API server with (default: in-cluster)")
	fs.StringVar(&f.claimsSocket, "claims-socket", "/run/nri-accel/claims.sock", "nri-accel's claims API socket")
	fs.StringVar(&f.devices, "devices", "", "comma-separated nri-accel device ids to publish (whole devices of exclusive pools; see nri-accel status)")
	fs.StringVar(&f.pluginsDir, "plugins-dir", "/var/lib/kubelet/plugins", "the kubelet's plugins dir: the DRA socket is <dir>/<driver-name>/dra.sock")
	fs.StringVar(&f.registryDir, "plugins-registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration dir")
	fs.DurationVar(&f.callTimeout, "call-timeout", 40*time.Second, "deadline of each call to nri-accel (below the kubelet's 45 s)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.nodeName == "" {
		return f, fmt.Errorf("no node name: pass -node-name or set NODE_NAME")
	}
	if strings.TrimSpace(f.devices) == "" {
		return f, fmt.Errorf("no devices: pass -devices with the nri-accel device ids to publish, e.g. -devices accel0,accel1")
	}
	return f, nil
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-dra-driver:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f); err != nil {
		klog.ErrorS(err, "go-dra-driver stopped")
		klog.Flush()
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) error {
	ctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	logger := klog.FromContext(ctx)
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig %q: %w", f.kubeconfig, err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	client := claims.New(f.claimsSocket, claims.WithCallTimeout(f.callTimeout))
	defer client.Close()

	// What to publish: the listed devices, as nri-accel names them (its status document says
	// which pool each device is in). nri-accel may still be starting: wait for it.
	var devs []device
	for {
		devs, err = inventory(ctx, client, splitList(f.devices))
		if err == nil {
			break
		}
		logger.Info("waiting for nri-accel", "socket", f.claimsSocket, "reason", err.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}

	d := &driver{name: f.driverName, pool: f.nodeName, client: client, devices: map[string]device{}, fatal: fatal}
	for _, dev := range devs {
		d.devices[dev.Name] = dev
	}
	// The helper listens in the plugin's own dir, which the kubelet does not make.
	pluginDir := filepath.Join(f.pluginsDir, f.driverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("make the plugin's dir: %w", err)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(f.driverName),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.KubeClient(kube),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(f.registryDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	logger.Info("go-dra-driver serving", "driver", f.driverName, "node", f.nodeName, "devices", len(devs), "claimsSocket", f.claimsSocket)
	logRegistration(ctx, helper)
	<-ctx.Done()
	// A signal ends the driver cleanly; a fatal error of the helper's is the driver's error.
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// logRegistration logs the kubelet's answer to the plugin's registration once it came (the
// helper keeps it; the kubelet sends it after it connected to the DRA socket).
func logRegistration(ctx context.Context, helper *kubeletplugin.Helper) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if st := helper.RegistrationStatus(); st != nil {
			if st.PluginRegistered {
				klog.FromContext(ctx).Info("registered with the kubelet")
			} else {
				klog.FromContext(ctx).Info("the kubelet refused the registration", "error", st.Error)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
