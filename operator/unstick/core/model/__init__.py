"""The model of a pod and its node: the facts of a snapshot bundle and a probe, the mount
table, mount identity and the kubelet's paths. Pure."""
