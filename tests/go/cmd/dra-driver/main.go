// Command dra-driver is the real node tier's DRA driver: the upstream test
// driver's kubelet plugin (k8s.io/kubernetes/test/e2e/dra/test-driver/app,
// the same gRPC, registration, ResourceSlice controller and optional KEP-5304
// metadata as any driver built on the kubelet plugin library), publishing the
// devices a JSON file describes, so that they carry realistic attributes and
// capacities (the stock driver publishes bare devices). When the file changes
// the driver republishes its slices, as a driver does when a device changes.
// The health of devices comes from a second file, re-read the same way, and
// reaches the kubelet through the DRAResourceHealth gRPC service, as a driver
// that monitors its hardware reports it. With --status-at-prepare it writes
// each prepared device's status into its claim before it answers the
// kubelet's NodePrepareResources (a network interface's name and the
// driver's data), as a NIC driver reports what it set up at prepare: for the
// claims annotated dra-driver.test/status-at-prepare, so that the other tests'
// claims stay as they were.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the driver's identity")
	nodeName := flag.String("node-name", "", "the node whose devices this driver publishes")
	driverName := flag.String("driver-name", "", "the driver's name (a DNS subdomain)")
	pluginsDir := flag.String("datadir", "", "the kubelet's plugins directory (the socket goes to DATADIR/DRIVER)")
	registryDir := flag.String("plugin-registration-path", "", "the kubelet's plugin registration directory")
	cdiDir := flag.String("cdi-dir", "", "where the driver writes its CDI specs")
	devicesFile := flag.String("devices", "", "JSON list of resource.k8s.io/v1 Devices to publish; re-read when it changes")
	metadata := flag.Bool("enable-device-metadata", false, "write KEP-5304 device metadata for prepared claims")
	healthFile := flag.String("health", "", `JSON list of {"pool","device","health","message"} reported to the kubelet; re-read when it changes`)
	statusAtPrepare := flag.Bool("status-at-prepare", false, "write each prepared device's status (interface name net-DEVICE, data {preparedBy}) into its claim, if annotated "+statusAnnotation+", before answering the kubelet")
	flag.Parse()
	if *nodeName == "" || *driverName == "" || *pluginsDir == "" || *registryDir == "" || *cdiDir == "" || *devicesFile == "" {
		fmt.Fprintln(os.Stderr, "dra-driver: --node-name, --driver-name, --datadir, --plugin-registration-path, --cdi-dir and --devices are required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *nodeName, *driverName, *pluginsDir, *registryDir, *cdiDir, *devicesFile, *healthFile, *metadata, *statusAtPrepare); err != nil {
		fmt.Fprintf(os.Stderr, "dra-driver: %v\n", err)
		os.Exit(1)
	}
}

func resources(node string, devices []resourceapi.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices}}}},
	}
}

func load(path, node string) ([]byte, *resourceslice.DriverResources, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var devices []resourceapi.Device
	if err := json.Unmarshal(raw, &devices); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	r := resources(node, devices)
	return raw, &r, nil
}

// deviceHealth is one entry of the --health file.
type deviceHealth struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Message string `json:"message"`
}

// loadHealth reads the --health file; a missing file reports nothing.
func loadHealth(path string) ([]byte, []deviceHealth, error) {
	if path == "" {
		return nil, nil, nil
	}
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var health []deviceHealth
	if err := json.Unmarshal(raw, &health); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return raw, health, nil
}

// statusAtPrepare writes, once the kubelet's NodePrepareResources has
// succeeded and before its answer leaves, each claim's devices of `driver`
// into its status.devices.
func statusAtPrepare(client kubernetes.Interface, driver string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return resp, err
		}
		var claims [][2]string
		switch r := req.(type) {
		case *drav1.NodePrepareResourcesRequest:
			for _, c := range r.Claims {
				claims = append(claims, [2]string{c.Namespace, c.Name})
			}
		case *drav1beta1.NodePrepareResourcesRequest:
			for _, c := range r.Claims {
				claims = append(claims, [2]string{c.Namespace, c.Name})
			}
		}
		for _, c := range claims {
			if err := writeStatus(ctx, client, driver, c[0], c[1]); err != nil {
				fmt.Fprintf(os.Stderr, "dra-driver: status of %s/%s: %v\n", c[0], c[1], err)
				return nil, err
			}
		}
		return resp, nil
	}
}

// The claims (through their template's metadata) whose status the driver writes at prepare.
const statusAnnotation = "dra-driver.test/status-at-prepare"

func writeStatus(ctx context.Context, client kubernetes.Interface, driver, namespace, name string) error {
	claim, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || claim.Annotations[statusAnnotation] == "" {
		return err
	}
	var devices []resourceapi.AllocatedDeviceStatus
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver {
			continue
		}
		data := runtime.RawExtension{Raw: []byte(fmt.Sprintf(`{"preparedBy":%q}`, driver))}
		devices = append(devices, resourceapi.AllocatedDeviceStatus{
			Driver: r.Driver, Pool: r.Pool, Device: r.Device,
			NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net-" + r.Device},
			Data:        &data,
		})
	}
	if len(devices) == 0 {
		return nil
	}
	claim.Status.Devices = devices
	_, err = client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	return err
}

func run(kubeconfig, node, driver, pluginsDir, registryDir, cdiDir, devicesFile, healthFile string, metadata, statusPrepare bool) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	datadir := filepath.Join(pluginsDir, driver)
	for _, dir := range []string{datadir, registryDir, cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	raw, published, err := load(devicesFile, node)
	if err != nil {
		return err
	}
	options := []any{
		app.FileOperations{DriverResources: published},
		app.Options{EnableHealthService: true},
		kubeletplugin.PluginDataDirectoryPath(datadir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.EnableDeviceMetadata(metadata, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
	}
	if statusPrepare {
		options = append(options, kubeletplugin.GRPCInterceptor(statusAtPrepare(client, driver)))
	}
	plugin, err := app.StartPlugin(klog.NewContext(ctx, klog.Background()), cdiDir, driver, client, node, options[0].(app.FileOperations), options[1:]...)
	if err != nil {
		return err
	}
	defer plugin.Stop()
	fmt.Fprintf(os.Stderr, "dra-driver: %s serving on node %s (metadata %v)\n", driver, node, metadata)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var healthRaw []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if now, health, err := loadHealth(healthFile); err != nil {
			fmt.Fprintf(os.Stderr, "dra-driver: keeping the reported health: %v\n", err)
		} else if !bytes.Equal(now, healthRaw) {
			healthRaw = now
			for _, h := range health {
				update := app.DeviceHealthUpdate{PoolName: h.Pool, DeviceName: h.Device, Health: h.Health, Message: h.Message}
				select {
				case plugin.HealthControlChan <- update:
				case <-ctx.Done():
					return nil
				}
			}
			fmt.Fprintf(os.Stderr, "dra-driver: reported the health in %s\n", healthFile)
		}
		now, next, err := load(devicesFile, node)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dra-driver: keeping the published devices: %v\n", err)
			continue
		}
		if bytes.Equal(now, raw) {
			continue
		}
		raw = now
		if err := plugin.PublishResources(ctx, *next); err != nil {
			fmt.Fprintf(os.Stderr, "dra-driver: republish: %v\n", err)
			continue
		}
		fmt.Fprintf(os.Stderr, "dra-driver: republished %s\n", devicesFile)
	}
}
