package nodeagent

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/labels"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

var everything = labels.Everything()

// PodResourcesClient reads kubelet's PodResources API v1 over its unix
// socket. The connection is lazy and reconnects on its own, so it survives
// kubelet restarts.
type PodResourcesClient struct {
	conn   *grpc.ClientConn
	client podresourcesapi.PodResourcesListerClient
}

var _ PodResourcesLister = (*PodResourcesClient)(nil)

// DialPodResources connects to kubelet's PodResources socket, e.g.
// /var/lib/kubelet/pod-resources/kubelet.sock.
func DialPodResources(socket string) (*PodResourcesClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to kubelet pod resources at %s: %w", socket, err)
	}
	return &PodResourcesClient{conn: conn, client: podresourcesapi.NewPodResourcesListerClient(conn)}, nil
}

// List implements PodResourcesLister.
func (c *PodResourcesClient) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod resources list: %w", err)
	}
	return resp.PodResources, nil
}

// Close closes the connection.
func (c *PodResourcesClient) Close() error { return c.conn.Close() }
