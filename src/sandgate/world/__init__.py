"""The test world for demo, prove, tests and benchmarks: namespaces, servers, fixtures.
Imports no agents: whoever builds it hands it the model servers' script.
"""

__all__ = [
    "fixtures",
    "homelab",
    "info",
    "llm",
    "loadgen",
    "servers",
    "topology",
]
