module unstick.dev/tests/kind/cnifail

go 1.22
