"""Figures on matplotlib's Agg canvas: series styles, one layout pass, a legend beside the
panels, PNG writing.

The object-oriented API without pyplot (matplotlib imported inside the functions): no GUI
backend is looked up, no registry of open figures keeps one alive, nothing is closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpkv.core.errors import OutputError
from cpkv.core.files.writes import reason
from cpkv.plots.common import require_matplotlib

DPI = 100
"""Pixels per inch of every PNG (matplotlib's default)."""
COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
"""matplotlib's ten-colour qualitative cycle (``tab10``)."""
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def figure(width: float, height: float) -> Any:
    """A figure of ``width`` x ``height`` inches on the Agg canvas, for :func:`save`."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def series_styles(n: int) -> list[dict[str, Any]]:
    """``color``, ``linestyle`` and ``marker`` for each of ``n`` series, no two alike.

    Up to ten series: ten colours, solid lines, round markers. More: the colours repeat every
    ten series, each repeat with its own line style and marker: no two series share a
    (colour, line style) pair up to 40 series, nor a (colour, line style, marker) triple up
    to 120.
    """
    out = []
    for i in range(n):
        turn = i // len(COLOURS)
        out.append({"color": COLOURS[i % len(COLOURS)],
                    "linestyle": LINE_STYLES[turn % len(LINE_STYLES)],
                    "marker": MARKERS[turn % len(MARKERS)]})  # fmt: skip
    return out


def save(fig: Any, path: Path, legend: bool | Sequence[Any] = False) -> Path:
    """Lay ``fig`` out and write it as a PNG through a temporary name.

    One layout pass (matplotlib's tight layout, without the second pass a layout rectangle
    costs and without savefig laying it out again); then ``legend`` (True: the labelled
    lines of every panel; or the handles to show) stands beside the panels
    (:func:`legend_beside`), and the figure widens when its title needs it.
    """
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        if legend is not False:
            legend_beside(fig, None if legend is True else legend)
        _fit_title(fig)
        fig.set_layout_engine(None)  # laid out: savefig draws it as it is
        fig.savefig(tmp, dpi=DPI)
        tmp.replace(path)
    except OSError as err:  # a full disk, a read-only folder: one line naming the file
        raise OutputError(f"{path}: cannot write ({reason(err)})") from None
    finally:
        tmp.unlink(missing_ok=True)  # a write that failed (full disk) leaves nothing
    return path


def legend_beside(fig: Any, handles: Sequence[Any] | None = None, fontsize: float = 7) -> None:
    """One legend for a laid-out figure, right of its panels (never over the data).

    ``handles`` default to the labelled artists of every panel, each label once, first seen
    first. The figure grows by the legend's width and the panels keep their size in inches;
    a legend taller than the figure takes more columns.
    """
    if handles is None:
        seen: dict[str, Any] = {}
        for ax in fig.axes:
            for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
                seen.setdefault(text, handle)
        handles, labels = list(seen.values()), list(seen)
    else:
        labels = [h.get_label() for h in handles]
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    columns = 1
    while True:
        legend = fig.legend(handles, labels, loc="center left", fontsize=fontsize, ncols=columns,
                            frameon=False, borderaxespad=0.2, handlelength=3)  # fmt: skip
        box = legend.get_window_extent(renderer)
        if box.height <= 0.95 * fig.bbox.height or columns >= len(handles):
            break
        legend.remove()
        columns += 1
    panels = fig.get_size_inches()[0]
    _widen(fig, 0.0, box.width / fig.dpi + 0.15)
    legend.set_bbox_to_anchor((panels / fig.get_size_inches()[0], 0.5), transform=fig.transFigure)


def _fit_title(fig: Any) -> None:
    """Widen the figure on both sides when its title is wider than it."""
    title = getattr(fig, "_suptitle", None)
    if title is None or not title.get_text():
        return
    need = title.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi + 0.3
    extra = need - fig.get_size_inches()[0]
    if extra > 0:
        _widen(fig, extra / 2, extra / 2)


def _widen(fig: Any, left: float, right: float) -> None:
    """Add ``left`` and ``right`` inches to a laid-out figure: the panels keep their size and
    their gaps (``wspace`` is a share of a panel's width), figure legends their place."""
    width, height = fig.get_size_inches()
    wider = width + left + right
    pars = fig.subplotpars
    fig.subplots_adjust(left=(pars.left * width + left) / wider,
                        right=(pars.right * width + left) / wider)  # fmt: skip
    for legend in fig.legends:
        anchor = legend.get_bbox_to_anchor().transformed(fig.transFigure.inverted())
        legend.set_bbox_to_anchor(((anchor.x0 * width + left) / wider, anchor.y0),
                                  transform=fig.transFigure)  # fmt: skip
    fig.set_size_inches(wider, height)
