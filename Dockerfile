# One image for every lockgate service; the command picks the service (python -m <service>).
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
COPY libs ./libs
COPY services ./services
# setuptools is in the venv already: no index is needed for this step.
RUN pip install --disable-pip-version-check --no-deps --no-build-isolation .
USER 10001
CMD ["python", "-m", "queue_store"]
