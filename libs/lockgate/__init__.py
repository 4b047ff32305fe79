"""lockgate's pure core: domain models, fairness, job states and event contracts.

Nothing in this package performs I/O; the import contract in pyproject.toml enforces it.
"""
