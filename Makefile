# unstick — the two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# bin/ tools built by `make tools`; CI may point these at the same versions installed its way
HELM ?= bin/helm
ACTIONLINT ?= bin/actionlint

.PHONY: all venv tools node-deps images kind-image lint test test-serial test-fast demo bench bench-quick manifests chart-readme proto clean help image chart dist release-notes test-chart version krew test-matrix test-envtest kind-up kind-down

help:
	@echo "make demo         local control plane + stuck pods + unstick fixing them, live"
	@echo "                  (on a real node when root can run one, else a kubelet stand-in)"
	@echo "make test         install everything (venv, Go-built binaries), lint, run all tests"
	@echo "                  (five pytest runs side by side: hack/run-tests.sh)"
	@echo "make test-serial  the same tests in one pytest process (~23 min)"
	@echo "make test-chart   the chart tests (tests/chart)"
	@echo "make test-matrix  (root) the kind suite on Kubernetes 1.32, 1.35 and 1.37, each from its own"
	@echo "                  pinned module (hack/test-matrix.sh; ~25 min warm, not in make test)"
	@echo "make test-envtest KUBE_VERSION=v1.32.13  the envtests (ENVTEST_PATHS, default tests/) against"
	@echo "                  that version's kube-apiserver, kubectl, kube-controller-manager (hack/envtest-bin.sh)"
	@echo "make lint         ruff, mypy (strict on the core), import contract, actionlint (workflows)"
	@echo "make tools        build kube-apiserver, etcd, kubectl, kwok, helm, kube-controller-manager,"
	@echo "                  kube-scheduler, kubelet into bin/"
	@echo "make node-deps    (root) apt-get install containerd, runc, CNI plugins, mmdebstrap, buildah, podman"
	@echo "make images       (root) build the unstick, pause and busybox images for the node suite"
	@echo "make kind-image   (root) build the kind suite's node image into podman (tests/machines/kind builds"
	@echo "                  it on first use too; docs/kind.md)"
	@echo "make kind-up      (root) a local kind cluster (3 machines, podman) with unstick installed"
	@echo "                  from the image and chart built here; docs/quickstart.md. make kind-down"
	@echo "make manifests    render manifests/ from the Helm chart"
	@echo "make chart-readme charts/unstick/README.md from the comments in values.yaml"
	@echo "make image        (root) the release image from the Dockerfile with buildah, this machine's"
	@echo "                  arch (ARCHES=\"amd64 arm64\" where it can run both): dist/unstick-VERSION.oci.tar"
	@echo "make chart        the chart, linted and packaged: dist/unstick-VERSION.tgz"
	@echo "make dist         the sdist and the wheel: dist/unstick-VERSION.tar.gz, dist/unstick-VERSION-*.whl"
	@echo "make krew         the krew plugin archive and manifest: dist/krew/"
	@echo "make release-notes VERSION=X.Y.Z  the CHANGELOG.md section of that version"
	@echo "make bench        scale benchmark against peer approaches (long)"
	@echo "make bench-quick  the same, small (under 5 minutes)"

all: test

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,test,dev]'
	# The dev harness (devcluster/) and bench/ live beside the package, not in it: the
	# development venv has the repository root on its path so every process it starts
	# (the demo, the benchmark, a test's subprocess) imports them.
	echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/unstick-dev-harness.pth"
	touch $(STAMP)

venv: $(STAMP)

tools:
	bash hack/build-tools.sh
	bash hack/build-thirdparty.sh

# The real-node suite (tests/machines/node): Debian's containerd, runc and CNI plugins, and the
# images built here. Both are no-ops (with a message) when not root.
node-deps:
	bash hack/install-node-deps.sh

images: node-deps
	bash hack/build-images.sh

# The kind suite's node image (tests/machines/kind; podman from node-deps, kind/kubeadm from tools).
kind-image: node-deps tools
	bash hack/build-kind-node-image.sh

# The quickstart (docs/quickstart.md): a local 3-machine kind cluster with unstick installed
# from the image and chart built here (devcluster/kind_up.py); kept until make kind-down.
kind-up: venv tools images
	$(PY) -m devcluster.kind_up

kind-down: venv
	$(PY) -m devcluster.kind_up --down

lint: venv
	$(VENV)/bin/ruff check operator devcluster tests bench hack
	$(VENV)/bin/ruff format --check operator devcluster tests bench hack
	$(VENV)/bin/mypy operator/unstick devcluster
	$(VENV)/bin/lint-imports
	@test -x $(ACTIONLINT) || bash hack/build-tools.sh
	$(ACTIONLINT) -no-color .github/workflows/*.yml

# Every test in five pytest runs side by side (hack/run-tests.sh: the real machines, three
# shares of the envtests, the rest); with PYTEST_ARGS one plain pytest run with them.
test: venv tools images lint
	PATH="$(CURDIR)/bin:$$PATH" bash hack/run-tests.sh $(PYTEST_ARGS)

# The same tests in one pytest process, one after the other (~22 min).
test-serial: venv tools images lint
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/pytest $(PYTEST_ARGS)

test-fast: venv
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/pytest -m 'not envtest and not mountns and not bench and not kind and not node' $(PYTEST_ARGS)

# On a real node (kubelet + containerd, unstick from the chart) when the machine can run one
# (root, node-deps, the images: `make images` is a no-op, with a message, when not root, and
# its failure only costs the real node); else with the kubelet stand-in. The demo says
# which. DEMO_ARGS=--node=stand-in forces the stand-in, --node=real the real node.
DEMO_ARGS ?=
demo: venv tools
	@$(MAKE) --no-print-directory images || echo "make images failed: no real node for the demo"
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/unstick demo $(DEMO_ARGS)

bench: venv tools
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/python -m bench.run --name full

bench-quick: venv tools
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/python -m bench.run --name quick

manifests: venv tools
	bash hack/render-manifests.sh

# charts/unstick/README.md from values.yaml's comments (helm-docs style; a test checks it)
chart-readme: venv
	$(PY) hack/chart-readme.py

# What a release publishes, built here (tests/packaging checks each; the release workflow
# runs the same targets): the image archive, the chart package, the sdist and the wheel.
DIST ?= dist
image:
	DIST="$(abspath $(DIST))" bash hack/build-image.sh

chart:
	@test -x $(HELM) || command -v $(HELM) >/dev/null || bash hack/build-tools.sh
	$(if $(wildcard $(PY)),$(PY),python3) hack/chart-readme.py --check
	$(HELM) lint --strict charts/unstick
	$(HELM) package charts/unstick --destination "$(DIST)"

# The chart tests (tests/chart: render, lint, schema, a real helm install into the test API server)
test-chart: venv tools
	PATH="$(CURDIR)/bin:$$PATH" $(VENV)/bin/pytest tests/chart $(PYTEST_ARGS)

# The kind suite once per Kubernetes version (MATRIX_VERSIONS), each in a copy of HEAD with
# its own pinned tools/kubernetes module, binaries and node image (hack/test-matrix.sh).
# Run here once on 2026-11-28: 1.32.13, 1.35.4 and 1.37.2 passed (docs/compatibility.md);
# not part of make test (its time).
test-matrix: venv node-deps
	bash hack/test-matrix.sh

# The envtests (marker envtest) against another Kubernetes version's kube-apiserver, kubectl
# and kube-controller-manager, built into the tools cache (hack/envtest-bin.sh says how when
# they are not): `make test-envtest KUBE_VERSION=v1.32.13 ENVTEST_PATHS=tests/controller`.
# Run here on 1.32.13 and 1.35.4 (docs/compatibility.md); not part of make test.
KUBE_VERSION ?=
ENVTEST_PATHS ?= tests
test-envtest: venv
	@test -n "$(KUBE_VERSION)" || { echo "make test-envtest: set KUBE_VERSION (e.g. v1.32.13)"; exit 2; }
	dir=$$(bash hack/envtest-bin.sh $(KUBE_VERSION)) && \
	UNSTICK_BIN_DIR="$$dir" UNSTICK_KUBE_VERSION=$(KUBE_VERSION) PATH="$$dir:$$PATH" \
	  $(VENV)/bin/pytest -p no:cacheprovider -m envtest $(ENVTEST_PATHS) $(PYTEST_ARGS)

# The version in pyproject.toml (= the chart's appVersion; the release tag is v<version>)
version:
	@sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -1

dist:
	@test -x $(PY) || $(MAKE) --no-print-directory venv
	$(PY) hack/build-dist.py "$(DIST)"

# The krew plugin: its archive (a launcher that installs unstick from PyPI on first use)
# and its manifest, for the GitHub release
krew:
	$(if $(wildcard $(PY)),$(PY),python3) hack/krew.py "$(DIST)"

# The CHANGELOG.md section of VERSION (the GitHub release's notes)
release-notes:
	@python3 hack/release-notes.py "$(VERSION)"

proto: venv
	bash hack/gen-proto.sh

clean:
	rm -rf $(VENV) bin .pytest_cache .mypy_cache .ruff_cache
