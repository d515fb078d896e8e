"""A child for `preemptible launch` tests: records the signals it gets, one name per line.

    python record_signals.py OUT MODE      MODE: exit85 | die | ignore

exit85: exit 85 on the first signal. die: re-raise the first signal with its default action.
ignore: keep running, with a grandchild that ignores TERM/INT/HUP in the same process group.
Writes OUT.json (pid, pgid, grandchild, the launcher's variables), then prints "ready".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

OUT, MODE = sys.argv[1], sys.argv[2]


def record(signum: int, frame: object) -> None:
    with open(OUT, "a") as f:
        f.write(signal.Signals(signum).name + "\n")
    if MODE == "exit85":
        os._exit(85)
    if MODE == "die":
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, record)
IGNORING_SLEEPER = (
    "import signal, time\nfor s in (1, 2, 15): signal.signal(s, signal.SIG_IGN)\ntime.sleep(60)"
)
grandchild = (
    subprocess.Popen([sys.executable, "-c", IGNORING_SLEEPER]) if MODE == "ignore" else None
)
with open(OUT + ".json", "w") as f:
    json.dump(
        {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "grandchild": grandchild.pid if grandchild else None,
            "launch_pid": os.environ.get("PREEMPTIBLE_LAUNCH_PID"),
            "translates": os.environ.get("PREEMPTIBLE_LAUNCH_TRANSLATES"),
        },
        f,
    )
print("ready", flush=True)
while True:
    signal.pause()
