"""Vidur's per-operator GPU profiles, read for calibration (``cpkv fit-cost --profile``).

A profile folder (``<gpu>_<org>_<model>/``, e.g. ``a100_meta-llama_Meta-Llama-3-8B``) holds
``mlp.csv``: one row per (token count, TP degree) with the model's shape (``n_head``,
``n_kv_head``, ``n_embd``, ``n_expanded_embd``, ``vocab_size``, ``use_gated_mlp``) and, in
**milliseconds**, ``time_stats.<op>.median`` of one layer's operators on one GPU. What is read:

* linear layers: ``attn_pre_proj`` (QKV) + ``attn_post_proj`` (attention output) +
  ``mlp_up_proj`` (gate+up) + ``mlp_down_proj`` — one layer's GEMM time;
* elementwise: ``input_layernorm`` + ``attn_rope`` + ``post_attention_layernorm`` +
  ``mlp_act`` + ``add``.

Rows repeated for one (token count, TP) are merged by their median. Next to the profile
folders, ``network_<gpu>_dgx/all_reduce.csv`` holds all-reduce medians by ``num_workers``,
``size`` (bytes) and ``devices_per_node`` (only single-node rows, ``devices_per_node ==
num_workers``, are read: NVLink). Every problem is one line naming the file, line and column.

Every number read is bounded: a time in [0, :data:`MAX_OP_MS`] ms (a row whose GEMMs, or
whose elementwise kernels, sum to 0 measured nothing), token counts within int32, a TP
degree or worker count within :data:`~cpkv.serving.cost.shapes.MAX_TP`, a size within
2**53 bytes, and the model's shape within the bounds of
:func:`~cpkv.serving.cost.shapes.shape_problem`.
"""

from __future__ import annotations

import contextlib
import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.errors import InputError
from cpkv.core.schema.limits import MAX_TOKENS
from cpkv.serving.cost.gpus import gpu_for_profile
from cpkv.serving.cost.shapes import MAX_TP, MODELS, ModelShape, shape_problem

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
KEY_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
MAX_OP_MS = 1e5
"""100 s for one layer's kernel: 700x the slowest in Vidur's profiles (136 ms)."""
MAX_BYTES = 2**53


@dataclass(frozen=True)
class OpTimes:
    """One TP degree of a profile: token counts (ascending) and one layer's times there."""

    tokens: tuple[int, ...]
    gemm_us: tuple[float, ...]
    elementwise_us: tuple[float, ...]


@dataclass(frozen=True)
class LinearProfile:
    """One profile folder: the GPU and model it measured, and its times by TP degree."""

    path: str
    gpu: str  # a name of cpkv.serving.cost.gpus.GPUS
    model: str | None  # a name of cpkv.serving.cost.shapes.MODELS (None: not in the registry)
    shape: ModelShape
    by_tp: dict[int, OpTimes]

    @property
    def label(self) -> str:
        return self.model or Path(self.path).name


@dataclass(frozen=True)
class AllReduceTimes:
    """All-reduce medians of one worker count, by size (ascending)."""

    sizes: tuple[int, ...]
    time_us: tuple[float, ...]


def profile_folders(root: str | Path) -> list[Path]:
    """``root`` when it holds ``mlp.csv``, else its sub-folders that do (sorted by name)."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(
            f"{root}: not a folder (a Vidur profile folder holding mlp.csv, or a folder of them)"
        )
    if (base / "mlp.csv").is_file():
        return [base]
    found = sorted(p for p in base.iterdir() if (p / "mlp.csv").is_file())
    if not found:
        raise InputError(
            f"{root}: holds no mlp.csv, nor do its sub-folders (Vidur profile folders)"
        )
    return found


def profile_folders_exist(base: Path) -> bool:
    return any((p / "mlp.csv").is_file() for p in base.iterdir() if p.is_dir())


def read_profile(folder: str | Path) -> LinearProfile:
    """A profile folder's ``mlp.csv``; InputError naming the file, line and column."""
    base = Path(folder)
    if not base.is_dir():
        raise InputError(f"{folder}: not a folder (a Vidur profile folder holding mlp.csv)")
    if not (base / "mlp.csv").is_file():
        hint = "; with --table, a folder of them" if profile_folders_exist(base) else ""
        raise InputError(f"{folder}: holds no mlp.csv (a Vidur profile folder holds one{hint})")
    gpu = gpu_for_profile(base.name)
    if gpu is None:
        raise InputError(
            f"{base}: the folder name does not say the GPU (expected a prefix a100_ or h100_, "
            "as Vidur names its profiles)"
        )
    file = base / "mlp.csv"
    gemm: dict[tuple[int, int], list[float]] = defaultdict(list)
    elem: dict[tuple[int, int], list[float]] = defaultdict(list)
    shape_values: tuple[str, ...] | None = None
    with _open(file) as rows:
        header = next(rows, None)
        if header is None:
            raise InputError(f"{file}:1: empty file; expected Vidur's mlp.csv header")
        columns = {name.strip(): i for i, name in enumerate(header)}
        wanted = (
            *(f"time_stats.{op}.median" for op in GEMM_OPS + ELEMENTWISE_OPS),
            *KEY_COLUMNS,
            *SHAPE_COLUMNS,
        )
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise InputError(f"{file}:1: header lacks column(s) {', '.join(missing)}")
        for lineno, row in enumerate(rows, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) < len(header):
                raise InputError(
                    f"{file}:{lineno}: {len(row)} columns; the header names {len(header)}"
                )
            tokens = _int(file, lineno, "num_tokens", row[columns["num_tokens"]], MAX_TOKENS)
            tp = _int(
                file,
                lineno,
                "num_tensor_parallel_workers",
                row[columns["num_tensor_parallel_workers"]],
                MAX_TP,
            )
            g = sum(
                _ms(file, lineno, op, row[columns[f"time_stats.{op}.median"]]) for op in GEMM_OPS
            )
            e = sum(
                _ms(file, lineno, op, row[columns[f"time_stats.{op}.median"]])
                for op in ELEMENTWISE_OPS
            )
            for kind, total in (("GEMM", g), ("elementwise", e)):
                if total <= 0:
                    raise InputError(
                        f"{file}:{lineno}: the {kind} columns sum to 0 ms: the row measured "
                        "nothing; allowed: times > 0"
                    )
            gemm[(tp, tokens)].append(g * 1000.0)
            elem[(tp, tokens)].append(e * 1000.0)
            values = tuple(row[columns[c]].strip() for c in SHAPE_COLUMNS)
            if shape_values is None:
                shape_values = values
            elif values != shape_values:
                raise InputError(
                    f"{file}:{lineno}: the model shape columns differ from line 2's (one model per file)"
                )
    if shape_values is None:
        raise InputError(f"{file}: no rows")
    shape, model = _shape(file, base.name, shape_values)
    by_tp: dict[int, OpTimes] = {}
    for tp in sorted({k[0] for k in gemm}):
        keys = sorted(k for k in gemm if k[0] == tp)
        by_tp[tp] = OpTimes(
            tuple(k[1] for k in keys),
            tuple(statistics.median(gemm[k]) for k in keys),
            tuple(statistics.median(elem[k]) for k in keys),
        )
    return LinearProfile(str(base), gpu, model, shape, by_tp)


def network_table(folder: str | Path) -> Path:
    """Where the all-reduce table of a profile folder's GPU is: ``../network_<gpu>_dgx/``."""
    base = Path(folder)
    prefix = base.name.split("_", 1)[0].lower()
    return base.parent / f"network_{prefix}_dgx" / "all_reduce.csv"


def read_allreduce(file: str | Path) -> dict[int, AllReduceTimes]:
    """Single-node all-reduce medians by worker count; InputError naming file, line, column."""
    path = Path(file)
    times: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with _open(path) as rows:
        header = next(rows, None)
        if header is None:
            raise InputError(f"{path}:1: empty file; expected Vidur's all_reduce.csv header")
        columns = {name.strip(): i for i, name in enumerate(header)}
        wanted = ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node")
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise InputError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        for lineno, row in enumerate(rows, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) < len(header):
                raise InputError(
                    f"{path}:{lineno}: {len(row)} columns; the header names {len(header)}"
                )
            workers = _int(path, lineno, "num_workers", row[columns["num_workers"]], MAX_TP)
            per_node = _int(
                path, lineno, "devices_per_node", row[columns["devices_per_node"]], MAX_TP
            )
            size = _int(path, lineno, "size", row[columns["size"]], MAX_BYTES)
            ms = _ms(path, lineno, "all_reduce", row[columns["time_stats.all_reduce.median"]])
            if ms <= 0:
                raise InputError(
                    f"{path}:{lineno}: column 'time_stats.all_reduce.median' is 0 ms: the row "
                    "measured nothing; allowed: a time > 0"
                )
            if per_node == workers:
                times[workers][size].append(ms * 1000.0)
    return {
        n: AllReduceTimes(tuple(sorted(by)), tuple(statistics.median(by[s]) for s in sorted(by)))
        for n, by in sorted(times.items())
    }


@contextlib.contextmanager
def _open(file: Path) -> Iterator[Iterator[list[str]]]:
    """The CSV rows of ``file``; InputError for a file that cannot be read or is not text."""
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            yield csv.reader(handle)
    except OSError as err:
        raise InputError(f"{file}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise InputError(f"{file}: not UTF-8 text; expected a CSV file") from None


def _int(file: Path, lineno: int, column: str, text: str, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(
            f"{file}:{lineno}: column {column!r} must be an integer >= 1, got {text!r}"
        )
    if value > high:
        raise InputError(f"{file}:{lineno}: column {column!r} must be <= {high}, got {text!r}")
    return value


def _ms(file: Path, lineno: int, op: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise InputError(
            f"{file}:{lineno}: column 'time_stats.{op}.median' must be a finite number of "
            f"milliseconds >= 0, got {text!r}"
        )
    if value > MAX_OP_MS:
        raise InputError(
            f"{file}:{lineno}: column 'time_stats.{op}.median' must be <= {MAX_OP_MS:g} ms "
            f"(100 s for one layer's kernel), got {text!r}"
        )
    return value


def _shape(file: Path, folder: str, values: tuple[str, ...]) -> tuple[ModelShape, str | None]:
    """The registry model the folder names (its shape checked against the file's), or the
    file's shape alone (layers unknown: 1)."""
    heads, kv_heads, hidden, mlp, vocab, gated = values
    try:
        numbers = [int(v) for v in (heads, kv_heads, hidden, mlp, vocab)]
    except ValueError:
        raise InputError(
            f"{file}:2: the shape columns {', '.join(SHAPE_COLUMNS[:5])} must be integers"
        ) from None
    gated_mlp = gated.strip().lower() == "true"
    for column, value in zip(SHAPE_COLUMNS, numbers, strict=False):
        if value < 1:
            raise InputError(f"{file}:2: column {column!r} must be an integer >= 1, got {value}")
    n_head, n_kv, n_embd, n_mlp, n_vocab = numbers
    for name in MODELS:
        shape = MODELS.get(name)
        if shape.hf_id and shape.hf_id.replace("/", "_").lower() in folder.lower():
            same = (shape.heads, shape.kv_heads, shape.hidden, shape.mlp, shape.gated_mlp) == (
                n_head, n_kv, n_embd, n_mlp, gated_mlp,
            )  # fmt: skip
            if not same:
                raise InputError(
                    f"{file}:2: the folder names {shape.hf_id}, but the shape columns differ from "
                    f"the registry's {name} (heads {n_head}, kv heads {n_kv}, hidden {n_embd}, MLP {n_mlp})"
                )
            return shape, name
    shape = ModelShape(1, n_embd, n_head, n_kv, max(1, n_embd // n_head), n_mlp, gated_mlp, n_vocab)
    problem = shape_problem(shape)
    if problem is not None:
        field, why = problem
        columns = {"heads": "n_head", "kv_heads": "n_kv_head", "hidden": "n_embd",
                   "mlp": "n_expanded_embd", "vocab": "vocab_size", "head_dim": "n_embd / n_head"}  # fmt: skip
        raise InputError(f"{file}:2: column {columns.get(field, field)!r} {why}")
    return shape, None
