"""Adapters: the one place each of Kafka, Postgres, Kubernetes and telemetry is touched."""
