# One image for every lockgate service; the command picks the service (python -m <service>).
# It ships only what the services run: the core (libs/lockgate), the adapters
# (libs/lockgate_adapters) and services/. devstack (the local stack, the simulator), the CLI,
# tests and benchmarks stay out; the import contracts in pyproject.toml (no service imports
# devstack, the CLI or the tests) are what make that safe.
# BASE: any image with Python >= 3.11 and venv; the official python image by default. Without a
# registry, devstack builds one from Debian (deploy/images/python, libs/devstack/images.py).
# extra-ca.crt, if the build context has one, is trusted by pip: a CA that re-signs outbound TLS
# (a corporate proxy), used by pip while installing.
ARG BASE=python:3.11-slim
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/lockgate/bin:$PATH
WORKDIR /app
# extra-ca.cr[t]: a pattern, so the build works whether or not the file is there.
COPY pyproject.toml README.md extra-ca.cr[t] ./
# The dependencies first, in a layer of their own: a change to lockgate's code alone reuses it.
RUN python -m venv /opt/lockgate \
 && if [ -f extra-ca.crt ]; then export PIP_CERT=/app/extra-ca.crt; fi \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install --disable-pip-version-check -r /tmp/requirements.txt "setuptools>=69" \
 && rm -f extra-ca.crt /tmp/requirements.txt \
 && useradd --uid 10001 lockgate
# These three COPY lines and devstack.images.IMAGE_SOURCES name the same folders (a unit test
# checks): `make compose-test` builds the image from a context of only those.
COPY libs/lockgate ./libs/lockgate
COPY libs/lockgate_adapters ./libs/lockgate_adapters
COPY services ./services
# setuptools is in the venv already: no index is needed for this step. It installs the packages
# it finds (those above); the CLI's console scripts, whose package is not here, are removed.
RUN pip install --disable-pip-version-check --no-deps --no-build-isolation . \
 && rm -f /opt/lockgate/bin/lockgate /opt/lockgate/bin/kubectl-lockgate \
          /opt/lockgate/bin/kubectl_complete-lockgate
USER 10001
CMD ["python", "-m", "queue_store"]
