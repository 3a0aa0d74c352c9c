"""Kernel plumbing: namespaces, links, policy -> nftables JSON and its atomic apply, iptables-nft
queues; the NFLOG, NFQUEUE and sock_diag readers; eBPF assembled and loaded without a compiler
(bpf.py) and the kernel's struct layouts it reads, from BTF (btf.py). Imports nothing from
``gateway/``.
"""

__all__ = [
    "bpf",
    "btf",
    "compile",
    "conntrack",
    "handed",
    "iphead",
    "iptables",
    "links",
    "lowfd",
    "netlink",
    "nflog",
    "nfqueue",
    "nft",
    "ns",
    "sockdiag",
]
