"""What the egress path costs: a jailed client through socat + the proxy, against direct.

A loopback HTTP server on the host answers a small request and 50 MB downloads. The
same stdlib client measures them three ways in one run:
  direct   on the host, straight to the server (the baseline);
  forward  inside a bwrap jail (no network, uid 65534) through the forwarder and the
           proxy, as an absolute-form request (plain HTTP forwarding);
  tunnel   the same, through a CONNECT tunnel (how agents reach https:// model APIs).
Every request opens a new connection (the proxy serves one request per connection).
With --no-jail (or without bwrap or root), the client runs on the host through the same
socat on a host port, which separates the jail's cost from the forwarder's and proxy's.
Run:
    .venv/bin/python bench/egress_latency.py [--requests 500] [--megabytes 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import structlog

from turnkeeper.config import Settings
from turnkeeper.sandbox.egress import (
    FORWARDER_PORT,
    ensure_proxy,
    forwarder_argv,
    jail_bind_args,
    lock_holder,
    proxy_environment,
    proxy_paths,
    with_forwarder,
)

BLOCK = os.urandom(1024 * 1024)
SMALL = b'{"type":"message","content":"a small model API answer"}\n'
PYTHON = "/usr/bin/python3"  # the same interpreter in the jail and on the host

# The client: one JSON line with every small request's latency and the median rate of
# three downloads.
CLIENT = r"""
import http.client, json, sys, time
host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
requests, megabytes = int(sys.argv[4]), int(sys.argv[5])
proxy = ("127.0.0.1", int(sys.argv[6])) if len(sys.argv) > 6 else None

def connection():
    if mode == "direct":
        return http.client.HTTPConnection(host, port), ""
    if mode == "tunnel":
        conn = http.client.HTTPConnection(*proxy)
        conn.set_tunnel(host, port)
        return conn, ""
    return http.client.HTTPConnection(*proxy), f"http://{host}:{port}"

def fetch(path):
    conn, prefix = connection()
    conn.request("GET", prefix + path)
    response = conn.getresponse()
    assert response.status == 200, response.status
    total = 0
    while chunk := response.read(1 << 20):
        total += len(chunk)
    conn.close()
    return total

latencies = []
for _ in range(requests):
    start = time.perf_counter()
    fetch("/small")
    latencies.append((time.perf_counter() - start) * 1000)
rates = []
for _ in range(3):
    start = time.perf_counter()
    size = fetch(f"/large/{megabytes}")
    rates.append(size / 1e6 / (time.perf_counter() - start))
print(json.dumps({"latencies_ms": latencies, "mb_per_s": sorted(rates)[1]}))
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        if self.path == "/small":
            self.send_response(200)
            self.send_header("Content-Length", str(len(SMALL)))
            self.end_headers()
            self.wfile.write(SMALL)
            return
        megabytes = int(self.path.rsplit("/", 1)[1])
        self.send_response(200)
        self.send_header("Content-Length", str(megabytes * len(BLOCK)))
        self.end_headers()
        for _ in range(megabytes):
            self.wfile.write(BLOCK)


def jail(socket_path: Path, command: list[str]) -> list[str]:
    """A bwrap jail like the tests': uid 65534, /usr read-only, no network, the proxy bound."""
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bwrap"]
    argv += ["--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if Path(top).is_symlink():
            argv += ["--symlink", str(Path(top).readlink()), top]
        elif Path(top).is_dir():
            argv += ["--ro-bind", top, top]
    argv += ["--proc", "/proc", "--dev", "/dev", "--clearenv"]
    argv += ["--tmpfs", "/tmp"]  # noqa: S108 - the jail's own, empty /tmp
    argv += [*jail_bind_args(socket_path), "--setenv", "PATH", "/usr/bin:/bin"]
    for name, value in proxy_environment().items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *with_forwarder(command)]


def run_client(argv: list[str]) -> dict[str, Any]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"client failed ({result.returncode}): {result.stderr.strip()}")
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def host_forwarder(socket_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Without a jail: the same socat on a free host port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    forwarder = subprocess.Popen(forwarder_argv(str(socket_path), port))
    for _ in range(1000):  # hang guard while socat binds
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return forwarder, port
        time.sleep(0.01)
    raise SystemExit("socat did not start listening")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="small requests per mode")
    parser.add_argument("--megabytes", type=int, default=50, help="size of the download")
    parser.add_argument(
        "--no-jail", action="store_true", help="run the client on the host, socat on a host port"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    data_dir = Path(tempfile.mkdtemp(prefix="tk-bench-egress-", dir="/tmp"))
    data_dir.chmod(0o711)
    settings = Settings(data_dir=data_dir, sandbox_egress=f"127.0.0.1:{port}")
    jailed = not args.no_jail and shutil.which("bwrap") is not None and os.geteuid() == 0
    jail_gid = 65534 if jailed else None
    socket_path = ensure_proxy(settings, jail_gid=jail_gid)
    forwarder = None
    try:
        client = [PYTHON, "-I", "-c", CLIENT, "127.0.0.1", str(port)]
        sizes = [str(args.requests), str(args.megabytes)]
        results = {"direct": run_client([*client, "direct", *sizes])}
        if not jailed:
            forwarder, proxy_port = host_forwarder(socket_path)
        for mode in ("forward", "tunnel"):
            if jailed:
                argv = jail(socket_path, [*client, mode, *sizes, str(FORWARDER_PORT)])
            else:
                argv = [*client, mode, *sizes, str(proxy_port)]
            results[mode] = run_client(argv)
        path = "bwrap jail (uid 65534) + socat" if jailed else "socat on the host (no jail)"
        print(f"egress path: {path} + proxy; {args.requests} small requests per mode (a new")
        print(f"connection each), the median of three {args.megabytes} MB downloads")
        base = results["direct"]
        base_p50 = statistics.median(base["latencies_ms"])
        base_p99 = percentile(base["latencies_ms"], 0.99)
        for mode, summary in results.items():
            p50 = statistics.median(summary["latencies_ms"])
            p99 = percentile(summary["latencies_ms"], 0.99)
            rate = summary["mb_per_s"]
            print(
                f"  {mode:8} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  {rate:8.1f} MB/s"
                f"   ratio vs direct: p50 x{p50 / base_p50:5.2f}  p99 x{p99 / base_p99:5.2f}"
                f"  throughput x{rate / base['mb_per_s']:5.2f}"
            )
    finally:
        if forwarder is not None:
            forwarder.terminate()
            forwarder.wait()
        pid = lock_holder(proxy_paths(settings, jail_gid=jail_gid).pidfile)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        server.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
