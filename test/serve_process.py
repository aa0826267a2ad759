"""An `oxygen-ros serve` child process for the tests: started on a free port, its output collected, stopped with
SIGINT (the way a person stops it)."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 240.0  # importing torch and loading the model; minutes on a busy machine
READY = re.compile(r"oxygen-ros serve: .* on ws://([0-9.]+):(\d+) ")


class ServeProcess:
    def __init__(self, *args: str, env: dict | None = None):
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        self.process = subprocess.Popen([sys.executable, "-m", "oxygen_ros.commands.cli", "serve", "--port", "0", *args],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.port: int | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            match = READY.search(line)
            if match:
                self.port = int(match.group(2))
                self._ready.set()
        self._ready.set()  # exited

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        """The port once the server listens; AssertionError with its output if it exits or takes too long."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.5):
            assert time.monotonic() < deadline, f"serve did not start within {timeout} s:\n{self.output}"
        assert self.port is not None, f"serve exited before listening:\n{self.output}"
        return self.port

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> tuple[int, str]:
        if self.alive():
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        return self.process.returncode, self.output
