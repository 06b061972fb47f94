"""A private PostgreSQL server for tests that stop and start it, or that need it to authenticate
(never the shared one, which trusts every connection)."""

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
    # initdb and postgres refuse to run as root: as root, they run as the postgres OS user
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class PrivateCluster:
    """initdb in a temporary folder, on `port`. With `password`, every connection (the superuser
    `postgres` with that password included) authenticates with SCRAM-SHA-256 (pg_hba `scram-sha-256`
    for local and host connections); without, it trusts everyone."""

    def __init__(self, port: int, *, password: str | None = None) -> None:
        self.port = port
        self.password = password
        self.root = Path(tempfile.mkdtemp(prefix="ggpo-pg-"))
        self.data = self.root / "data"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        auth = ["-A", "trust"]
        if password is not None:
            pwfile = self.root / "pwfile"
            pwfile.write_text(password + "\n")
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        subprocess.run(_as_postgres([_bin("initdb"), "-D", str(self.data), *auth, "-U", "postgres", "--no-sync"]),
                       check=True, capture_output=True)

    def url_of(self, user: str = "postgres", password: str | None = None, database: str = "postgres") -> str:
        secret = f":{password}" if password is not None else (f":{self.password}" if user == "postgres" and
                                                               self.password is not None else "")
        return f"postgresql+psycopg://{user}{secret}@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_of()

    def start(self, *, settings: dict[str, str] | None = None, env: dict[str, str] | None = None) -> None:
        """Start it; `settings` are more `-c name=value` server settings, `env` more of the server's environment."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        opts += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
                                     str(self.root / "log"), "-w", "-t", "30", "start"]), check=True,
                       capture_output=True, env={**os.environ, **(env or {})})

    def stop(self) -> None:
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                       check=False, capture_output=True)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
