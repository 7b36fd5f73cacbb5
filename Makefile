# egress-placer: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test unit generate reliability cluster-build coexist matrix image bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

# Build (or find in the cache) the local cluster's binaries: minutes the first time, nothing after.
cluster-build: $(STAMP)
	$(PY) -m devcluster build --with prometheus --with tekton-webhook --with tekton-resolvers --with helm --with helm-docs --with prometheus-operator-crds --with floor-webhook --with actionlint --with oci-registry

# The main job: a local cluster, Tekton, the controller under its k8s/ identity, a mix of runs, and where they went.
demo: cluster-build
	$(PY) -m devcluster demo

# Every test: the pure core, the adapters and the end-to-end tests on a real local cluster.
test: cluster-build
	$(PY) -m pytest

# Beside the platform components of issue #25: builds Karpenter (KWOK provider), Kueue, tekton-kueue (~25-35 min) and Kyverno (~13 min
# cold on 2 cores, so not part of cluster-build), then runs the tests marked `coexist`. `make test` runs those tests
# too when the binaries are cached, and skips them, saying so, when they are not.
coexist: $(STAMP)
	$(PY) -m devcluster build --with karpenter --with kueue --with tekton-kueue --with kyverno
	$(PY) -m pytest -m coexist

# The compatibility matrix (issue #29, docs/compatibility.md): every supported Tekton LTS and the newest on the newest
# Kubernetes, the newest Tekton on the three newest Kubernetes minors; each cell builds its pair (cached per pair) and runs
# the placement, guard, queue and defaults e2e tests and Tekton's examples with and without placement. Outside CI (hours
# cold); resumable: a cell with a row for this commit in docs/compatibility.json is skipped.
matrix: $(STAMP)
	$(PY) -m devplacer.matrix

# Only the tests that need no cluster (seconds); the duplicate-code check (tests/unit/test_duplicates.py) is one of them.
unit: $(STAMP)
	$(PY) -m pytest -m "not cluster"

# Every file derived from code (CRDs, the pool guard's manifest and chart template): devplacer/generate.py.
# A unit test fails when a committed one differs; `$(PY) -m devplacer.generate --check` names them.
generate: $(STAMP)
	$(PY) -m devplacer.generate

# The fault and abuse suite alone (it also runs in `make test`), then docs/reliability.md from its figures.
reliability: cluster-build
	$(PY) tests/reliability/report.py

# The controller's image from the Dockerfile, without a Docker daemon: Debian's buildah on a Debian base
# made by mmdebstrap (cached); installs buildah, mmdebstrap, podman and runc with apt-get when missing (root).
image: $(STAMP)
	$(PY) -m devplacer.image

bench: cluster-build
	$(PY) -m bench --mode full

bench-quick: cluster-build
	$(PY) -m bench --mode quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# The release workflow's steps here (docs/releasing.md): the image built with buildah, pushed to a registry on
# 127.0.0.1 (distribution, from its Go module), signed with a generated cosign key and verified, the chart pushed
# as an OCI artifact and installed from it onto a local cluster, the pulled image run as the Deployment runs it.
# Not part of .ci/run (tests/e2e/test_release_oci.py is). Warm: ~3 min after a code change (167 s, 186 s on 2 shared cores), 42 s with none; cold: add cosign's build (~13 min).
.PHONY: release-dry-run actionlint
release-dry-run: cluster-build
	$(PY) -m devcluster build --with oci-registry --with cosign
	$(PY) -m devplacer.release

# The workflows checked by actionlint, built from its Go module (tests/unit/test_workflows.py runs it too).
actionlint: $(STAMP)
	$(PY) -m devcluster build --with actionlint
	$$($(PY) -c 'from devcluster.build import ensure_optional; print(ensure_optional("actionlint", lambda m: None))')/actionlint -color
