"""The trace capacity curve as a PNG (needs matplotlib; imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpkv.core.errors import OutputError
from cpkv.core.files import reason
from cpkv.trace.stats import CurvePoint


def plot_capacity_curve(points: Sequence[CurvePoint], path: str | Path, title: str = "") -> Path:
    """Write hit % against cache capacity (% of the working set) to `path`; return the path.

    Draws the total hit and, when L2 is on at any point, the L1 and L2 shares.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.capacity_pct for p in points]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    try:
        ax.plot(xs, [p.cache_pct for p in points], marker="o", label="L1 + L2 hit")
        if any(p.l2_tokens for p in points):
            ax.plot(xs, [p.l1_hit_pct for p in points], marker=".", ls="--", label="L1 hit")
            ax.plot(xs, [p.l2_hit_pct for p in points], marker=".", ls=":", label="L2 hit")
        ax.set_xlabel("L1 capacity (% of the unlimited working set)")
        ax.set_ylabel("cached prompt tokens (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
        ax.legend()
        if title:
            ax.set_title(title)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        tmp = out.with_name(f".{out.stem}.tmp{out.suffix}")
        try:
            fig.savefig(tmp)
            tmp.replace(out)  # never a half-written PNG under the final name
        except OSError as err:  # a full disk, a read-only folder: one line naming the file
            raise OutputError(f"{out}: cannot write ({reason(err)})") from None
        finally:
            tmp.unlink(missing_ok=True)  # a write that failed (full disk) leaves nothing
    finally:
        plt.close(fig)
    return out
