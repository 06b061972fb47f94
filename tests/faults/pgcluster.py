"""A private PostgreSQL server for fault tests that stop and start it (never the shared one)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise FileNotFoundError(f"PostgreSQL server binary {name} not found")
    return found[-1]


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PrivateCluster:
    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="ggpo-pg-"))
        self.data = self.root / "data"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        subprocess.run(_as_postgres([_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                                     "--no-sync"]), check=True, capture_output=True)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
                                     str(self.root / "log"), "-w", "-t", "30", "start"]), check=True,
                       capture_output=True)

    def stop(self) -> None:
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                       check=False, capture_output=True)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


