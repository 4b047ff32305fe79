# One image for every lockgate service; the command picks the service (python -m <service>).
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
RUN pip install --disable-pip-version-check . && useradd --uid 10001 lockgate
USER 10001
CMD ["python", "-m", "queue_store"]
