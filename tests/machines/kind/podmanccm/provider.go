package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	v1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"
)

// ProviderName is --cloud-provider's value.
const ProviderName = "podman"

// providerIDPrefix: kind sets each node's providerID to kind://podman/<cluster>/<node>,
// the node being named after its container (as cloud-provider-kind reads it).
const providerIDPrefix = "kind://podman/"

// clusterLabel is the label kind puts on each node's container: its cluster's name.
const clusterLabel = "io.x-k8s.kind.cluster"

// cloud answers for the containers of ONE kind cluster, named in the cloud config
// (--cloud-config: a file whose content is the cluster's name). A node whose container
// belongs to another cluster (or to none) is an error, never "gone": the lifecycle
// controller deletes the Node of an instance that does not exist.
type cloud struct {
	cluster string
	podman  string // the podman binary ($PODMAN, else podman on PATH)
}

func newCloud(config io.Reader) (cloudprovider.Interface, error) {
	if config == nil {
		return nil, errors.New("podman: --cloud-config must name the kind cluster")
	}
	raw, err := io.ReadAll(config)
	if err != nil {
		return nil, fmt.Errorf("podman: reading the cloud config: %w", err)
	}
	cluster := strings.TrimSpace(string(raw))
	if cluster == "" || strings.ContainsAny(cluster, " \n\t") {
		return nil, fmt.Errorf("podman: the cloud config must hold one kind cluster name, got %q", raw)
	}
	bin := os.Getenv("PODMAN")
	if bin == "" {
		bin = "podman"
	}
	return &cloud{cluster: cluster, podman: bin}, nil
}

func (c *cloud) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (c *cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return nil, false }
func (c *cloud) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (c *cloud) InstancesV2() (cloudprovider.InstancesV2, bool)                    { return c, true }
func (c *cloud) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (c *cloud) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (c *cloud) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (c *cloud) ProviderName() string                                              { return ProviderName }
func (c *cloud) HasClusterID() bool                                                { return true }

// container is the node's container: from its providerID if set, else its name (kind
// names each node after its container). A providerID of another kind cluster or
// another form is an error.
func (c *cloud) container(node *v1.Node) (string, error) {
	id := node.Spec.ProviderID
	if id == "" {
		return node.Name, nil
	}
	rest, ok := strings.CutPrefix(id, providerIDPrefix)
	cluster, name, _ := strings.Cut(rest, "/")
	if !ok || cluster != c.cluster || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("node %s: providerID %q is not %s%s/<container>", node.Name, id, providerIDPrefix, c.cluster)
	}
	return name, nil
}

// state is the container's label clusterLabel and its status (podman's words:
// running, paused, exited, stopped, created, ...); found false when there is no such
// container.
func (c *cloud) state(ctx context.Context, name string) (cluster, status string, found bool, err error) {
	cmd := exec.CommandContext(ctx, c.podman, "container", "inspect", "--format",
		fmt.Sprintf(`{{index .Config.Labels %q}} {{.State.Status}}`, clusterLabel), name)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// podman inspect says "no such container" for a name it does not know: only then
		// is the instance gone. Any other failure is an error (never "gone").
		if strings.Contains(strings.ToLower(stderr.String()), "no such container") {
			return "", "", false, nil
		}
		return "", "", false, fmt.Errorf("podman container inspect %s: %v: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	fields := strings.Fields(stdout.String())
	if len(fields) != 2 {
		return "", "", false, fmt.Errorf("podman container inspect %s: unexpected answer %q", name, stdout.String())
	}
	return fields[0], fields[1], true, nil
}

// ours is the node's container's status, or an error if it belongs to another cluster.
func (c *cloud) ours(ctx context.Context, node *v1.Node) (status string, found bool, err error) {
	name, err := c.container(node)
	if err != nil {
		return "", false, err
	}
	cluster, status, found, err := c.state(ctx, name)
	if err != nil || !found {
		return "", found, err
	}
	if cluster != c.cluster {
		return "", false, fmt.Errorf("node %s: container %s belongs to kind cluster %q, not %q", node.Name, name, cluster, c.cluster)
	}
	return status, true, nil
}

// InstanceExists: the node's container exists.
func (c *cloud) InstanceExists(ctx context.Context, node *v1.Node) (bool, error) {
	_, found, err := c.ours(ctx, node)
	return found, err
}

// InstanceShutdown: the container exists and is stopped (exited, stopped, or created and
// never started). A paused container is not shut down: its processes are still there,
// frozen, as on a machine cut off from the network.
func (c *cloud) InstanceShutdown(ctx context.Context, node *v1.Node) (bool, error) {
	status, found, err := c.ours(ctx, node)
	if err != nil {
		return false, err
	}
	if !found {
		return false, cloudprovider.InstanceNotFound
	}
	var shutdown bool
	switch status {
	case "running", "paused":
		shutdown = false
	case "exited", "stopped", "created", "configured":
		shutdown = true
	default:
		return false, fmt.Errorf("node %s: container status %q is neither running nor stopped", node.Name, status)
	}
	// (the kind suite waits for this line: the controller asked about the node)
	klog.Infof("podman: node %s: container is %s: shutdown=%t", node.Name, status, shutdown)
	return shutdown, nil
}

// InstanceMetadata: the providerID kind://podman/<cluster>/<container>, as kind sets it.
func (c *cloud) InstanceMetadata(ctx context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	name, err := c.container(node)
	if err != nil {
		return nil, err
	}
	if _, found, err := c.ours(ctx, node); err != nil {
		return nil, err
	} else if !found {
		return nil, cloudprovider.InstanceNotFound
	}
	return &cloudprovider.InstanceMetadata{ProviderID: providerIDPrefix + c.cluster + "/" + name, InstanceType: "podman"}, nil
}
