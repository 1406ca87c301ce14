"""`llamavk bench` results and their output formats, as llama-bench writes them.

- md: llama-bench's table (columns and minimum widths of its markdown printer; the split mode column
  always, since comparing split modes is what llamavk bench is for), then a `build:` line;
- csv: a header of field names, then one row per test, every value quoted, bools as 0/1;
- json: an array with one object per test: every field plus samples_ns and samples_ts;
- jsonl: the same objects, one per line.
Each printer streams: header() before the first test, row() as each test finishes, footer() at the end.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bench import BenchParams, BenchTest, ModelInfo

BACKEND = "Vulkan"
N_GPU_LAYERS = 99      # llama-bench's "all layers on the GPU": llamavk never runs layers on the CPU


def format_size(nbytes: int) -> str:
    """llama-bench's size column: MiB below 1 GiB, else GiB."""
    if nbytes < 1 << 30:
        return f"{nbytes / 2**20:.2f} MiB"
    return f"{nbytes / 2**30:.2f} GiB"


def format_params(n: int) -> str:
    """llama-bench's params column: millions below 1e9, else billions."""
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


@dataclass(frozen=True)
class RunInfo:
    """What llama-bench records about the build and the machine, the same for every row."""
    build_commit: str
    version: str
    cpu_info: str
    gpu_info: str


def run_info(gpu_names: list[str]) -> RunInfo:
    from . import __version__
    return RunInfo(_git_commit(Path(__file__).resolve().parent.parent) or "unknown", __version__, _cpu_name(),
                   ", ".join(gpu_names))


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _git_commit(root: Path) -> str | None:
    """Short commit of the llamavk checkout at root, with "-dirty" where its code (llamavk/, shaders/)
    differs from that commit, so that a figure is never credited to a commit whose code did not run;
    None when llamavk is installed (whatever repository a virtual environment sits in is not llamavk's)."""
    if not (root / "pyproject.toml").is_file() or not (root / ".git").exists():
        return None
    commit = _git(root, "rev-parse", "--short", "HEAD")
    if not commit:
        return None
    changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "llamavk", "shaders")
    return commit + "-dirty" if changed else commit


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Result:
    test: BenchTest
    model: ModelInfo
    samples_ns: list[int]
    test_time: str            # ISO 8601 UTC, when the test started

    @property
    def samples_ts(self) -> list[float]:
        n = self.test.n_prompt + self.test.n_gen
        return [1e9 * n / ns for ns in self.samples_ns]

    def row(self, info: RunInfo) -> dict:
        """llama-bench's fields, typed (ints, bools, floats), in its order, plus the samples."""
        t, ns, ts = self.test, self.samples_ns, self.samples_ts
        return {
            "build_commit": info.build_commit, "llamavk_version": info.version,
            "cpu_info": info.cpu_info, "gpu_info": info.gpu_info, "backends": BACKEND,
            "model_filename": self.model.filename, "model_type": self.model.type,
            "model_size": self.model.size, "model_n_params": self.model.n_params,
            "n_batch": t.n_batch, "n_ubatch": t.n_ubatch, "type_k": t.type_k, "type_v": t.type_v,
            "n_gpu_layers": N_GPU_LAYERS, "split_mode": t.split_mode, "main_gpu": t.main_gpu,
            "no_kv_offload": False, "flash_attn": t.flash_attn, "devices": devices_text(t.devices),
            "tensor_split": tensor_split_text(t.tensor_split), "max_gpu": t.max_gpu, "reduce_type": t.reduce_type,
            "use_mmap": True, "embeddings": False,
            "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth, "test_time": self.test_time,
            "avg_ns": int(statistics.mean(ns)), "stddev_ns": int(_stdev(ns)),
            "avg_ts": statistics.mean(ts), "stddev_ts": _stdev(ts),
            "samples_ns": list(ns), "samples_ts": ts,
        }


def _stdev(values) -> float:
    """Sample standard deviation (n - 1), 0 for a single sample, as llama-bench reports it."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def devices_text(devices: tuple[str, ...] | None) -> str:
    return "auto" if devices is None else "/".join(devices)


def tensor_split_text(ts: tuple[float, ...]) -> str:
    """llama-bench's form: each proportion %.2f, '/'-joined up to the last non-zero; '0.00' if none."""
    last = max((i for i, x in enumerate(ts) if x > 0), default=0)
    return "/".join(f"{x:.2f}" for x in (ts or (0.0,))[:last + 1])


# markdown: field -> (header, width); width < 0 left-aligns (llama-bench's get_field_width)
MD_COLUMNS = {
    "model": ("model", -30), "size": ("size", 10), "params": ("params", 10), "backend": ("backend", -10),
    "n_gpu_layers": ("ngl", 3), "n_batch": ("n_batch", 7), "n_ubatch": ("n_ubatch", 8),
    "type_k": ("type_k", -10), "type_v": ("type_v", -10),
    "main_gpu": ("main_gpu", 10), "split_mode": ("sm", -10), "flash_attn": ("fa", 2),
    "devices": ("dev", -12), "tensor_split": ("ts", -12), "max_gpu": ("max_gpu", 10),
    "reduce_type": ("reduce_type", -11), "test": ("test", 15), "t/s": ("t/s", 20),
}
# shown only when set to something else than the default, before and after the sm column
MD_BEFORE_SM = ("n_batch", "n_ubatch", "type_k", "type_v", "main_gpu")
MD_AFTER_SM = ("flash_attn", "devices", "tensor_split", "max_gpu", "reduce_type")


class Printer:
    """Streams one format: header(), then row() per finished test, then footer()."""

    def __init__(self, params: BenchParams, info: RunInfo):
        self.params, self.info, self.first = params, info, True

    def header(self) -> str:
        return ""

    def row(self, r: Result) -> str:
        raise NotImplementedError

    def footer(self) -> str:
        return ""


class MarkdownPrinter(Printer):
    """llama-bench's table: fixed columns, sm always (split modes are what llamavk compares), other
    settings only when given a non-default value."""

    def __init__(self, params, info):
        super().__init__(params, info)
        self.columns = (["model", "size", "params", "backend", "n_gpu_layers"]
                        + [f for f in MD_BEFORE_SM if params.non_default(f)] + ["split_mode"]
                        + [f for f in MD_AFTER_SM if params.non_default(f)] + ["test", "t/s"])

    @staticmethod
    def _line(cells: list[tuple[str, int]]) -> str:
        return "|" + "".join(f" {text:>{w}} |" if w > 0 else f" {text:<{-w}} |" for text, w in cells) + "\n"

    def header(self) -> str:
        heads = [MD_COLUMNS[c] for c in self.columns]
        rule = [("-" * (abs(w) - 1) + (":" if w > 0 else "-"), w) for _, w in heads]
        return self._line(heads) + self._line(rule)

    def row(self, r: Result) -> str:
        d = r.row(self.info)
        values = {"model": r.model.type, "size": format_size(r.model.size),
                  "params": format_params(r.model.n_params), "backend": BACKEND, "test": r.test.name,
                  "t/s": f"{d['avg_ts']:.2f} ± {d['stddev_ts']:.2f}",
                  "flash_attn": str(int(d["flash_attn"]))}
        return self._line([(values[c] if c in values else str(d[c]), MD_COLUMNS[c][1]) for c in self.columns])

    def footer(self) -> str:
        return f"\nbuild: {self.info.build_commit} (llamavk {self.info.version})\n"


def _csv_value(v) -> str:
    """llama-bench's csv values: bools as 0/1, floats with 6 decimals."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.6f}"
    return str(v)


class CsvPrinter(Printer):
    """One header line of field names, then a row per test; every value quoted (llama-bench)."""

    def _fields(self, d: dict) -> list[str]:
        return [k for k in d if not k.startswith("samples_")]

    def header(self) -> str:
        return ""     # written with the first row: the field list comes from the row

    def row(self, r: Result) -> str:
        d = r.row(self.info)
        buf = io.StringIO()
        w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
        if self.first:
            self.first = False
            buf.write(",".join(self._fields(d)) + "\n")
        w.writerow([_csv_value(d[k]) for k in self._fields(d)])
        return buf.getvalue()


class JsonPrinter(Printer):
    """A JSON array written as tests finish: '[', objects separated by ',', ']'."""

    def header(self) -> str:
        return "[\n"

    def row(self, r: Result) -> str:
        body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in r.row(self.info).items())
        sep = "" if self.first else ",\n"
        self.first = False
        return f"{sep}  {{\n{body}\n  }}"

    def footer(self) -> str:
        return "\n]\n"


class JsonlPrinter(Printer):
    def row(self, r: Result) -> str:
        return json.dumps(r.row(self.info)) + "\n"


PRINTERS = {"md": MarkdownPrinter, "csv": CsvPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter}
