"""What a stuck pod blocks (design.md §9): blocked replacements, blocked namespaces, the
kubelet's FailedKillPod Events, namespaces held by an unavailable API."""
