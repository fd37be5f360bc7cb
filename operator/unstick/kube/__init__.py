"""unstick.kube"""
