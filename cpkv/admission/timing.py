"""Wall-clock and CPU time of an admission run, and its decisions per second.

``cpkv admit`` (mode ``passes``) reports them under ``summary.timing``, apart from the
deterministic counts: these numbers change from run to run (timing metrics).

* ``workload_s``: loading the workload (JSONL parsing, trace replay, generation); not part
  of the admission time.
* ``admission_s``: the backend's whole run: building the model, every pass, every record
  and the summary.
* ``decisions_per_s``: ``decisions / admission_s``, a decision being one ``add_one_req`` or
  ``add_chunked_req`` call. The ``*_cpu_s`` twins use process CPU time, which other work on
  a busy machine disturbs less than wall-clock time.
"""

from __future__ import annotations

from cpkv.core.timing import Elapsed


def timing_summary(decisions: int, workload: Elapsed, admission: Elapsed) -> dict[str, float]:
    """The ``summary.timing`` mapping (rates are 0.0 when a time rounds to zero)."""
    return {
        "workload_s": round(workload.wall_s, 6),
        "workload_cpu_s": round(workload.cpu_s, 6),
        "admission_s": round(admission.wall_s, 6),
        "admission_cpu_s": round(admission.cpu_s, 6),
        "decisions_per_s": round(decisions / admission.wall_s, 1) if admission.wall_s > 0 else 0.0,
        "decisions_per_cpu_s": (
            round(decisions / admission.cpu_s, 1) if admission.cpu_s > 0 else 0.0
        ),
    }


def timing_note(decisions: int, timing: dict[str, float]) -> str:
    """One line for the run's notes."""
    return (
        f"timing: {decisions:,} decisions in {timing['admission_s']:.3f} s = "
        f"{timing['decisions_per_s']:,.0f} decisions/s (CPU {timing['admission_cpu_s']:.3f} s = "
        f"{timing['decisions_per_cpu_s']:,.0f}/s); loading the workload took "
        f"{timing['workload_s']:.3f} s (not counted)"
    )
