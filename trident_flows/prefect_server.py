"""A local Prefect server for the demo and the walk-through: start one when none is running,
say where it is, stop only what we started.

Contract:
- ``ensure_server()`` returns a ``ServerInfo`` for a healthy Prefect API, in this order: the
  server a previous ``ensure_server()`` started (its pid file under ``.prefect-demo/``), the
  server ``PREFECT_API_URL`` names, a server already answering on ``127.0.0.1:port``; else it
  starts ``prefect server start`` bound to 127.0.0.1 only, with its own SQLite database under
  ``.prefect-demo/home``, records its pid, and waits until ``/api/health`` answers.
- ``stop_server()`` stops the server named by the pid file (only if that process is still a
  Prefect server) and removes the pid file; it never touches a server it did not start.
- ``connected(info)`` points this process's Prefect client at the server (Prefect reads its
  settings at import, so setting the environment variable afterwards is not enough).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

DEFAULT_DIR = Path(".prefect-demo")
DEFAULT_PORT = 4200
HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServerInfo:
    """``url`` is the API URL (``PREFECT_API_URL``), ``ui_url`` the UI's base address."""

    url: str
    ui_url: str
    started_by_us: bool

    def flow_run_url(self, flow_run_id: object) -> str:
        """The UI page of one flow run."""
        return f"{self.ui_url}/runs/flow-run/{flow_run_id}"


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def _ui_url(api_url: str) -> str:
    return api_url.rstrip("/").removesuffix("/api")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((HOST, port)) != 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _state_path(state_dir: Path) -> Path:
    return state_dir / "server.json"


def _pid_path(state_dir: Path) -> Path:
    return state_dir / "server.pid"


def _our_server(state_dir: Path) -> tuple[psutil.Process, str] | None:
    """The server process our pid file names, if it is still alive and still a Prefect server."""
    try:
        pid = int(_pid_path(state_dir).read_text().strip())
        url = json.loads(_state_path(state_dir).read_text())["url"]
        process = psutil.Process(pid)
        cmdline = " ".join(process.cmdline())
    except (OSError, ValueError, KeyError, psutil.Error):
        return None
    if "prefect" not in cmdline or "server" not in cmdline:
        return None
    return process, url


def ensure_server(port: int = DEFAULT_PORT, state_dir: Path = DEFAULT_DIR, timeout_s: float = 180.0,
                  reuse_env: bool = True) -> ServerInfo:
    """A healthy Prefect API: an existing one if found (see the module contract), else a new
    local server on ``127.0.0.1:port`` (SQLite under ``state_dir/home``)."""
    state_dir = Path(state_dir)
    ours = _our_server(state_dir)
    if ours is not None and _healthy(ours[1]):
        return ServerInfo(ours[1], _ui_url(ours[1]), started_by_us=True)
    env_url = os.environ.get("PREFECT_API_URL")
    if reuse_env and env_url and _healthy(env_url):
        return ServerInfo(env_url, _ui_url(env_url), started_by_us=False)
    api_url = f"http://{HOST}:{port}/api"
    if _healthy(api_url):
        return ServerInfo(api_url, _ui_url(api_url), started_by_us=False)
    if not _port_free(port):
        raise RuntimeError(f"port {port} on {HOST} is taken by something that is not a Prefect server: pass another port")

    state_dir.mkdir(parents=True, exist_ok=True)
    home = (state_dir / "home").resolve()
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=api_url,
               PREFECT_SERVER_API_HOST=HOST, PREFECT_SERVER_API_PORT=str(port), PREFECT_UI_API_URL=api_url)
    log = open(state_dir / "server.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port),
                                "--analytics-off"], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    log.close()
    _pid_path(state_dir).write_text(str(process.pid))
    _state_path(state_dir).write_text(json.dumps({"pid": process.pid, "url": api_url, "port": port}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _healthy(api_url):
            return ServerInfo(api_url, _ui_url(api_url), started_by_us=True)
        if process.poll() is not None:
            break
        time.sleep(0.5)
    stop_server(state_dir)
    raise RuntimeError(f"the Prefect server on {api_url} did not become healthy within {timeout_s:.0f} s; "
                       f"see {state_dir / 'server.log'}")


def stop_server(state_dir: Path = DEFAULT_DIR, timeout_s: float = 20.0) -> bool:
    """Stop the server ``ensure_server`` started (and its children); True if one was stopped."""
    state_dir = Path(state_dir)
    ours = _our_server(state_dir)
    stopped = False
    if ours is not None:
        process = ours[0]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except psutil.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        stopped = True
    for path in (_pid_path(state_dir), _state_path(state_dir)):
        path.unlink(missing_ok=True)
    return stopped


@contextlib.contextmanager
def connected(info: ServerInfo) -> Iterator[ServerInfo]:
    """Point this process's Prefect client (and child processes) at ``info.url`` while inside."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = info.url
    try:
        with temporary_settings({PREFECT_API_URL: info.url}):
            yield info
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
