"""Helpers shared by the integration and end-to-end tests (they import devstack and the clients).

- `waiting`: poll until a condition holds, failing with what was awaited;
- `kube`: pods and deployments built like sentences, namespaces ready for pods, gates;
- `kafka`: consumers positioned at the topics' end, and tails that collect what is published;
- `postgres`: fresh databases per module or test, optionally migrated or cloned from a template;
- `network`: a loopback relay that a test can sever to simulate an outage;
- `services`: lockgate's services run in this process or as processes, isolated for a test.

`tests/unit` never imports these: unit tests need no stack.
"""
