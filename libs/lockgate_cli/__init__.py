"""The `lockgate` command line (also `kubectl lockgate`): a client of the admin API over HTTP.

Why a package of its own, beside the adapters: the CLI is a user's tool, not part of any
service. It talks to queue-store's admin API over HTTP (httpx) and to the trace store's query
API, never to Kafka, Postgres or Kubernetes, and nothing in the services imports it (the
import-linter contracts in pyproject.toml say so). One module per noun (`queue`, `jobs`,
`jobset`, `namespace`, `status`, `explain`, `trace`, `cluster`, `token`, `config`,
`completion`, `webhook_tls`); `root` builds the command and its global options, `output` prints
every answer (`-o table|wide|name|json|yaml|jsonpath=...`), `contexts` reads the config file.
"""
