"""A training loop without torch: install a guard, run steps, save once on a notice, exit.

    python guarded_loop.py MARKER [SAVE_SECONDS]

Prints "ready" once the guard is installed and "saving" when the final save starts; writes MARKER
(JSON) at the end of the save and exits with the guard's exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time

from preemptible import PreemptionGuard

STEP_SECS = 0.05


def main() -> int:
    marker = sys.argv[1]
    save_secs = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    started = completed = -1
    started_at = 0.0
    with PreemptionGuard() as guard:
        print("ready", flush=True)
        for step in range(1_000_000):
            started, started_at = step, time.time()
            end = time.monotonic() + STEP_SECS
            while time.monotonic() < end:  # busy work, so the signal lands mid-step
                sum(range(1000))
            completed = step
            if guard.requested:
                with guard.final_save():
                    print("saving", flush=True)
                    time.sleep(save_secs)  # a second signal may land here
                    record = {
                        "started": started,
                        "completed": completed,
                        "last_step_started_at": started_at,
                        "received_at": guard.received_at,
                        "signal": guard.signal.name if guard.signal else None,
                        "count": guard.count,
                        "exit_code": guard.exit_code(),
                    }
                    with open(marker + ".tmp", "w") as f:
                        json.dump(record, f)
                    os.replace(marker + ".tmp", marker)
                return guard.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
