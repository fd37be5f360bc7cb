"""The node probe and each of its scans: the mount table, containers, pod tasks, hung
mounts and who waits on them, registered plugins, volume directories, the kubelet's health."""
