"""The log readers: NFLOG packets to events (logreader.py), joining them with the guest side's
sender (attribution.py), and which process made a flow (procattr.py, procparse.py and the
first-packet hold, prochold.py). Handed a sink; never the daemon.
"""

__all__ = [
    "attribution",
    "logreader",
    "procattr",
    "prochold",
    "procparse",
]
