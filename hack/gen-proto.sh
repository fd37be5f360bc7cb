#!/usr/bin/env bash
# Regenerate the Python gRPC modules of the agent's .proto subset (CSI, kubelet plugin
# registration, CRI). The generated *_pb2*.py files are committed; run this (or `make proto`)
# after changing a .proto. Needs grpcio-tools (dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
# -I operator makes the generated imports absolute: `from unstick.agent.proto import csi_pb2`.
"$PY" -m grpc_tools.protoc -I operator \
  --python_out=operator --grpc_python_out=operator --pyi_out=operator \
  operator/unstick/agent/proto/csi.proto \
  operator/unstick/agent/proto/pluginregistration.proto \
  operator/unstick/agent/proto/cri.proto
echo "generated: $(ls operator/unstick/agent/proto/*_pb2*.py* | tr '\n' ' ')"
