// Command vf-device-plugin advertises GPUs to a kubelet the way NVIDIA's device plugin does, for
// the end-to-end suite's real nodes (which have no GPUs): it serves the kubelet's device-plugin
// API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) on a socket in the kubelet's device-plugin
// directory and registers there, so the node's capacity and allocatable of the resource
// (nvidia.com/gpu by default) come from the kubelet's device manager, and a container that asks
// for some gets them allocated by the kubelet, with NVIDIA_VISIBLE_DEVICES naming them as
// NVIDIA's plugin sets it. The devices are names only: nothing is mounted.
//
// The kubelet removes every socket in its device-plugin directory when it starts, so the plugin
// watches the kubelet's own socket and registers again when it is replaced.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// plugin serves the device-plugin API for one resource. Its methods are called concurrently by
// gRPC; it holds no mutable state.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    <-chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once (they never change) and holds the stream open until the
// plugin stops or the kubelet hangs up.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-stream.Context().Done():
	}
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate gives each container the names of its devices, as NVIDIA's plugin does.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("allocate %s", strings.Join(c.DevicesIds, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// serve listens on socket and registers with the kubelet; it returns the server, already
// serving, or an error saying which step failed.
func serve(dir, endpoint, resource string, p *plugin) (*grpc.Server, error) {
	socket := filepath.Join(dir, endpoint)
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("removing the old socket %s: %w", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("connecting to the kubelet: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
	})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("registering %s with the kubelet: %w", resource, err)
	}
	return server, nil
}

// inode is the inode number of path, 0 when it is missing.
func inode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func main() {
	dir := flag.String("dir", filepath.Dir(pluginapi.KubeletSocket), "the kubelet's device-plugin directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource to advertise")
	count := flag.Int("count", 1, "how many devices to advertise")
	prefix := flag.String("prefix", "GPU-", "device IDs are this prefix and 0..count-1")
	flag.Parse()
	log.SetPrefix("vf-device-plugin: ")
	if *count < 0 {
		log.Fatalf("--count %d: must be 0 or more", *count)
	}
	stop := make(chan struct{})
	p := &plugin{stop: stop}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s%d", *prefix, i), Health: pluginapi.Healthy})
	}
	endpoint := "vf-" + strings.NewReplacer("/", "-", ".", "-").Replace(*resource) + ".sock"
	kubeletSocket := filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket))

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	var server *grpc.Server
	var registered uint64
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		// (Re-)register whenever the kubelet's socket is there and is not the one registered
		// with: the kubelet started, or restarted and removed this plugin's socket.
		if ino := inode(kubeletSocket); ino != 0 && ino != registered {
			if server != nil {
				server.Stop()
				server = nil
			}
			s, err := serve(*dir, endpoint, *resource, p)
			if err != nil {
				log.Printf("%v; trying again", err)
			} else {
				server, registered = s, ino
				log.Printf("registered %d x %s at %s", *count, *resource, filepath.Join(*dir, endpoint))
			}
		}
		select {
		case sig := <-signals:
			log.Printf("%v: stopping", sig)
			close(stop)
			if server != nil {
				server.Stop()
			}
			return
		case <-tick.C:
		}
	}
}
