"""Files for other engines from the same policy: Cilium and Kubernetes egress policy.

Every verdict is ``policy/``'s: the address space is laid out by asking ``decide()``
(export/space.py), and what an engine cannot say is reported (export/unexpressed.py).
Pure: no sockets, no kernel. ``gatewayvm`` writes a gateway VM's files; its ruleset is the
daemon's own compiler's (net/handed.py, itself pure).
"""

__all__ = ["cilium", "gatewayvm", "k8s", "space", "unexpressed"]
