"""The test world's servers, each run as its own process by the world builder.

    python -m sandgate.world.servers.<model|web|dns|listen> ...   # see each module

Every server prints one `READY {json}` line once all its sockets listen, logs one JSON
object per line to `--log`, and exits 0 on SIGTERM. `launch.start` runs one and waits
for READY; `launch.wait_log` follows its log. The shared pieces: `runtime` (addresses,
logs, signals, TLS), `httpio`/`http2` (h11/h2 serving), `lockstep` (un-bufferable SSE).
"""

__all__: list[str] = []
