"""The trace simulator: the pure scheduling core replayed in virtual time (`preemptible sim`)."""

from preemptible.sim.engine import SimOptions, SimResult, Simulator
from preemptible.sim.failures import FailureRates
from preemptible.sim.gpu_ids import NodeTopology
from preemptible.sim.kpis import summarize
from preemptible.sim.trace import TraceJob, read_trace, write_trace

__all__ = [
    "FailureRates",
    "NodeTopology",
    "SimOptions",
    "SimResult",
    "Simulator",
    "TraceJob",
    "read_trace",
    "summarize",
    "write_trace",
]
