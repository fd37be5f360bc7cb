// podman-ccm: the upstream cloud controller manager of k8s.io/cloud-provider (its own
// command, flags and controllers, unchanged) with one provider of the project's own,
// "podman": the kind suite's machines are podman containers (docs/kind.md, "A cloud
// controller manager for kind's machines"). Test-only: never part of unstick.
//
// Run with --cloud-provider=podman --controllers=cloud-node-lifecycle: the upstream
// cloud node lifecycle controller then taints a NotReady node whose container is stopped
// with node.cloudprovider.kubernetes.io/shutdown and deletes the Node of a container
// that is gone.
package main

import (
	"os"

	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"
)

func main() {
	cloudprovider.RegisterCloudProvider(ProviderName, newCloud)
	ccmOptions, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	command := app.NewCloudControllerManagerCommand(ccmOptions, cloudInitializer,
		app.DefaultInitFuncConstructors, names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	os.Exit(cli.Run(command))
}

// cloudInitializer is upstream's sample (k8s.io/cloud-provider/sample/basic_main.go).
func cloudInitializer(c *config.CompletedConfig) cloudprovider.Interface {
	shared := c.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(shared.Name, shared.CloudConfigFile)
	if err != nil {
		klog.Fatalf("cloud provider could not be initialized: %v", err)
	}
	if cloud == nil {
		klog.Fatalf("cloud provider %q is unknown", shared.Name)
	}
	return cloud
}
