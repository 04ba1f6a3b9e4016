"""Fixtures: a live `spindle serve` on the embedded demo model, on a free loopback port."""

import os
import subprocess
import threading
import time
import urllib.request

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--spindle-bin",
        default=os.environ.get("SPINDLE_BIN", "target/release/spindle"),
        help="path to the spindle binary to test",
    )


class Server:
    def __init__(self, binary, *extra):
        if not os.path.isfile(binary):
            raise FileNotFoundError(f"no spindle binary at {binary}: build it with cargo build --release")
        self.proc = subprocess.Popen(
            [binary, "serve", "--host", "127.0.0.1", "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self._first_line(timeout=60)
        # "spindle serve: spindle-demo on http://127.0.0.1:PORT/v1 (Ctrl-C to stop)"
        self.base_url = line.split(" on ", 1)[1].split()[0]
        assert self.base_url.startswith("http://127.0.0.1:"), line
        self.root = self.base_url[: -len("/v1")]
        self._wait_healthy(timeout=30)

    def _first_line(self, timeout):
        found = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not found or not found[0]:
            self.proc.kill()
            raise RuntimeError(f"spindle serve did not start: {self.proc.stderr.read()}")
        return found[0].strip()

    def _wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.root + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("spindle serve never answered /health")

    def stop(self):
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert code == 0, f"spindle serve exited with {code}: {self.proc.stderr.read()}"


@pytest.fixture(scope="session")
def spindle_bin(request):
    return os.path.abspath(request.config.getoption("--spindle-bin"))


@pytest.fixture(scope="session")
def server(spindle_bin):
    s = Server(spindle_bin, "--parallel", "2")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def keyed_server(spindle_bin):
    s = Server(spindle_bin, "--api-key", "test-key-123")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cors_server(spindle_bin):
    s = Server(spindle_bin, "--cors-origins", "http://localhost:3000,http://127.0.0.1:5173")
    yield s
    s.stop()
