"""A stand-in rank for tests/test_rank_server.py: `python -m tests.support.rank_probe WHAT [ARGS]`.

- `report`: print this process's pid, parent's pid, working directory, argv and GGPO_PROBE as JSON
  on stdout, `on stderr` on stderr; exit 0.
- `exit N`: exit N.
- `wait FILE`: on SIGUSR2 write "usr2" to FILE and exit 7; print "ready <pid>" and sleep.
- `sleep`: print "ready <pid>" and sleep.
- `die SIGNUM`: kill itself with SIGNUM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "report":
        print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                          "probe": os.environ.get("GGPO_PROBE")}))
        print("on stderr", file=sys.stderr)
        return 0
    if what == "exit":
        return int(argv[1])
    if what == "die":
        os.kill(os.getpid(), int(argv[1]))
        time.sleep(30)
        return 1
    if what == "wait":
        def on_usr2(signum: int, frame: object) -> None:
            Path(argv[1]).write_text("usr2")
            os._exit(7)

        signal.signal(signal.SIGUSR2, on_usr2)
    print(f"ready {os.getpid()}", flush=True)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
