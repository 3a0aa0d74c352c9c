"""Kernel plumbing: namespaces, links, policy -> nftables JSON and its atomic apply, iptables-nft
queues; the NFLOG, NFQUEUE and sock_diag readers. Imports nothing from ``gateway/``.
"""

__all__ = [
    "compile",
    "conntrack",
    "handed",
    "iphead",
    "iptables",
    "links",
    "netlink",
    "nflog",
    "nfqueue",
    "nft",
    "ns",
    "sockdiag",
]
