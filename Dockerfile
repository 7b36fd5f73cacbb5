# syntax=docker/dockerfile:1
# egress-placer controller image.
#   docker build -t egress-placer:0.1.0 .
#   make image    # the same without a Docker daemon: Debian's buildah, PYTHON_IMAGE a local Debian base
#                 # made by mmdebstrap (devplacer/image.py; tools installed with apt-get when missing)
# The builder installs the project's pinned dependencies (their list alone, so a change of code or
# of other parts of pyproject.toml does not reinstall them), then a wheel of the project, into a
# virtualenv at /opt/egress-placer.
# The final stage copies that venv only: no compiler, no pip, no source tree. The final stage must use
# the same Python image as the builder, because the venv's interpreter is a link to the image's python.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# The pinned dependencies, read from pyproject.toml: the builder copies this list alone, so its pip
# install stays cached while the code or the rest of pyproject.toml changes.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /
RUN python -c "import tomllib; print(*tomllib.load(open('/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
      > /requirements.txt

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python -m venv /opt/egress-placer
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN /opt/egress-placer/bin/pip install --requirement /tmp/requirements.txt
# Then one wheel for the project (its build backend is pinned in pyproject.toml), installed without
# dependencies; `pip check` proves they are all there. pip byte-compiles on install, so nothing needs
# writing at run time.
COPY pyproject.toml README.md LICENSE ./
COPY controller ./controller
RUN /opt/egress-placer/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/egress-placer/bin/pip install --no-deps /wheels/egress_placer-*.whl \
 && /opt/egress-placer/bin/pip check \
 && /opt/egress-placer/bin/pip uninstall --yes pip \
 && /opt/egress-placer/bin/egress-placer --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="egress-placer" \
      org.opencontainers.image.description="Places Tekton runs that need good internet egress onto the node pools that have it." \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/egress-placer/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=builder /opt/egress-placer /opt/egress-placer
# A numeric user that exists nowhere in /etc/passwd: Kubernetes can check runAsNonRoot on it.
USER 65532:65532
EXPOSE 8443 8080
# Exec form: no shell at run time. The root filesystem can be read-only; /tmp is the only scratch
# space the process uses (an emptyDir in k8s/deployment.yaml).
ENTRYPOINT ["egress-placer"]
CMD ["run"]
