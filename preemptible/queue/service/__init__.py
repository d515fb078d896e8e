"""The reference queue manager: `preemptible queue serve` (docs/user-guide/queue-manager.md).

It needs the queue extra (`pip install 'preemptible[queue]'`: FastAPI, uvicorn, pydantic,
platformdirs); without it, importing any of its modules says so, in one line.
"""

from preemptible._extras import require

require("queue", "the queue manager (preemptible.queue.service)")
