"""`llamavk bench`: llama-bench for every split mode (SPEC §6).

Users compare split modes, devices and models with it, and scripts already parse llama-bench's
output, so flags, semantics and output follow llama.cpp's llama-bench:
- every test flag takes a comma list and may be repeated; every combination runs, in llama-bench's
  order (model outermost, then the load settings, then batch sizes, depth and the tests), so a model
  is loaded once for all the tests that share its load settings;
- -p/-n/-d/-b/-ub also take ranges: FIRST-LAST, FIRST-LAST+STEP, FIRST-LAST*MULT;
- graph mode's --max-gpu and --reduce-type are load settings like -sm, so they take lists too;
- inside one -ts or -dev value, '/' separates devices ("3/1", "Vulkan0/Vulkan1"); ',' separates
  the alternatives to run;
- a test is a prompt of n_prompt random tokens and/or n_gen single-token decodes, after n_depth
  tokens put into the KV cache untimed; each repetition is timed as a whole and its rate is
  (n_prompt + n_gen) / seconds; the report is mean ± sample standard deviation of the rates;
- output: llama-bench's markdown table, csv, json (one object per test, every parameter plus
  samples_ns and samples_ts) or jsonl.

Beyond llama-bench: -m also takes synthetic:PRESET-TYPE[-ARCH] (random weights, written once into
~/.cache/llamavk/synthetic/ and reused), and -sm has llamavk's tensor and graph modes. llamavk's
attention is always a flash-attention kernel, so -fa is 1 (the default here) and -fa 0 is refused.
llama-bench command lines may also carry -ngl (only values meaning every layer on the GPUs, checked
against each model's layer count before anything runs) and -t (no effect). -ctk/-ctv (KV cache types
f16, q8_0, q4_0, q4_1, q5_0, q5_1; lists like the other load settings) fill llama-bench's type_k / type_v fields.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .bench_format import PRINTERS, Result, devices_text, run_info
from .errors import LlamavkError, UsageError
from .gguf_file import check_model_path
from .llamacpp_compat import FLASH_ATTN_OFF, FLASH_ATTN_ON, check_cache_type, check_gpu_layers, parse_gpu_layers

SPLIT_MODES = ("none", "layer", "row", "tensor", "graph")     # llamavk.split.MODES (a test checks)
REDUCE_TYPES = ("f32", "f16", "bf16")                         # llamavk.split.REDUCE_TYPES
OUTPUTS = ("md", "csv", "json", "jsonl")
SYNTHETIC_PREFIX = "synthetic:"


# ----------------------------------------------------------------------------------------------
# parameters: the parsed command line, one list of alternatives per test setting
# ----------------------------------------------------------------------------------------------

@dataclass
class BenchParams:
    models: list[str | None] = field(default_factory=lambda: [None])   # None: the default model
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    n_pg: list[tuple[int, int]] = field(default_factory=list)
    n_depth: list[int] = field(default_factory=lambda: [0])
    n_batch: list[int] = field(default_factory=lambda: [2048])
    n_ubatch: list[int] = field(default_factory=lambda: [512])
    split_mode: list[str] = field(default_factory=lambda: ["layer"])
    main_gpu: list[int] = field(default_factory=lambda: [0])
    devices: list[tuple[str, ...] | None] = field(default_factory=lambda: [None])   # None: auto
    tensor_split: list[tuple[float, ...]] = field(default_factory=lambda: [()])     # (): auto
    max_gpu: list[int] = field(default_factory=lambda: [0])                        # 0: no limit
    reduce_type: list[str] = field(default_factory=lambda: ["f16"])
    type_k: list[str] = field(default_factory=lambda: ["f16"])       # -ctk
    type_v: list[str] = field(default_factory=lambda: ["f16"])       # -ctv
    flash_attn: list[bool] = field(default_factory=lambda: [True])
    gpu_layers: list[int] = field(default_factory=list)   # -ngl: checked to mean "every layer", see run_bench
    repetitions: int = 5
    output: str = "md"
    warmup: bool = True

    def non_default(self, name: str) -> bool:
        """llama-bench shows a column when its setting has several values or a non-default one."""
        return getattr(self, name) != getattr(BenchParams(), name)


_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def parse_int_range(text: str, flag: str) -> list[int]:
    """llama-bench's int lists: '512', '1,2,4', '16-64' (step 1), '16-64+16', '16-64*2'."""
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise UsageError(f"{flag}: bad value {part!r}; expected N, FIRST-LAST, FIRST-LAST+STEP or "
                             f"FIRST-LAST*MULT (comma-separated)")
        first = int(m[1])
        last = int(m[2]) if m[2] else first
        op, step = m[3] or "+", int(m[4]) if m[4] else 1
        if last < first:
            raise UsageError(f"{flag}: empty range {part!r} (last < first)")
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:    # '+0', '*1' or '0-8*2' would never reach the end
                raise UsageError(f"{flag}: range {part!r} does not increase")
            i = nxt
    return out


def _items(values: list[str]) -> list[str]:
    """Comma-separated items of every occurrence of a flag."""
    return [item.strip() for v in values for item in v.split(",")]


def _ints(values: list[str], flag: str, minimum: int) -> list[int]:
    out = [n for v in values for n in parse_int_range(v, flag)]
    bad = [n for n in out if n < minimum]
    if bad:
        raise UsageError(f"{flag}: {bad[0]} is below the minimum {minimum}")
    return out


def _pairs(values: list[str]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        parts = [p.strip() for p in v.split(",")]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise UsageError(f"-pg: bad value {v!r}; expected PP,TG (repeat -pg for several)")
        out.append((int(parts[0]), int(parts[1])))
    return out


def _split_modes(values: list[str]) -> list[str]:
    out = [s.lower() for s in _items(values)]
    for s in out:
        if s not in SPLIT_MODES:
            raise UsageError(f"-sm: unknown split mode {s!r}; choose from {', '.join(SPLIT_MODES)}")
    return out


def _tensor_splits(values: list[str]) -> list[tuple[float, ...]]:
    out = []
    for item in _items(values):
        try:
            parts = tuple(float(x) for x in re.split(r"[;/]+", item) if x.strip())
        except ValueError:
            raise UsageError(f"-ts: bad value {item!r}; expected proportions like 3/1") from None
        if not parts or any(x < 0 or x != x for x in parts):
            raise UsageError(f"-ts: bad value {item!r}; proportions must be numbers >= 0")
        out.append(parts if any(parts) else ())    # all zero = llama-bench's default (automatic)
    return out


def _reduce_types(values: list[str]) -> list[str]:
    out = [s.lower() for s in _items(values)]
    for s in out:
        if s not in REDUCE_TYPES:
            raise UsageError(f"--reduce-type: unknown type {s!r}; choose from {', '.join(REDUCE_TYPES)}")
    return out


def _device_lists(values: list[str]) -> list[tuple[str, ...] | None]:
    out = []
    for item in _items(values):
        if item.lower() == "auto":
            out.append(None)
            continue
        names = tuple(n.strip() for n in item.split("/"))
        if not all(names):
            raise UsageError(f"-dev: empty device name in {item!r}; use Vulkan0/Vulkan1 for several")
        out.append(names)
    return out


def _flash_attn(values: list[str]) -> list[bool]:
    out = []
    for item in _items(values):
        if item.lower() in FLASH_ATTN_ON:
            out.append(True)
        elif item.lower() in FLASH_ATTN_OFF:
            raise UsageError(f"-fa {item}: llamavk's attention is always a flash-attention kernel; only -fa 1 exists")
        else:
            raise UsageError(f"-fa: bad value {item!r}; expected 1 (or on, auto)")
    return out


def _gpu_layers(values: list[str]) -> list[int]:
    return [parse_gpu_layers(item) for item in _items(values)]


def _cache_types(values: list[str], flag: str) -> list[str]:
    return [check_cache_type(flag, item) for item in _items(values)]


def parse_params(*, model=(), n_prompt=(), n_gen=(), pg=(), n_depth=(), batch=(), ubatch=(),
                 split_mode=(), tensor_split=(), main_gpu=(), device=(), flash_attn=(), max_gpu=(),
                 reduce_type=(), gpu_layers=(), cache_type_k=(), cache_type_v=(),
                 repetitions: int = 5, output: str = "md", no_warmup: bool = False) -> BenchParams:
    """Command-line strings (each flag: a list of its occurrences; empty or None when not given, which
    keeps llama-bench's default) -> BenchParams. UsageError on bad input."""
    p = BenchParams(repetitions=repetitions, output=output, warmup=not no_warmup)
    if model:
        p.models = _items(list(model))
        if not all(p.models):
            raise UsageError("-m: empty model name")
    parsed = {
        "n_prompt": n_prompt and _ints(list(n_prompt), "-p", 0),
        "n_gen": n_gen and _ints(list(n_gen), "-n", 0),
        "n_pg": pg and _pairs(list(pg)),
        "n_depth": n_depth and _ints(list(n_depth), "-d", 0),
        "n_batch": batch and _ints(list(batch), "-b", 1),
        "n_ubatch": ubatch and _ints(list(ubatch), "-ub", 1),
        "split_mode": split_mode and _split_modes(list(split_mode)),
        "tensor_split": tensor_split and _tensor_splits(list(tensor_split)),
        "main_gpu": main_gpu and _ints(list(main_gpu), "-mg", 0),
        "max_gpu": max_gpu and _ints(list(max_gpu), "--max-gpu", 0),
        "reduce_type": reduce_type and _reduce_types(list(reduce_type)),
        "devices": device and _device_lists(list(device)),
        "flash_attn": flash_attn and _flash_attn(list(flash_attn)),
        "gpu_layers": gpu_layers and _gpu_layers(list(gpu_layers)),
        "type_k": cache_type_k and _cache_types(list(cache_type_k), "-ctk"),
        "type_v": cache_type_v and _cache_types(list(cache_type_v), "-ctv"),
    }
    for name, value in parsed.items():
        if value:
            setattr(p, name, value)
    if repetitions < 1:
        raise UsageError("-r must be at least 1")
    if output not in OUTPUTS:
        raise UsageError(f"-o: unknown format {output!r}; choose from {', '.join(OUTPUTS)}")
    if not expand(p):
        raise UsageError("nothing to run: every -p, -n and -pg value is 0")
    return p


# ----------------------------------------------------------------------------------------------
# tests: every combination, in llama-bench's order
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchTest:
    model: str | None
    split_mode: str
    main_gpu: int
    devices: tuple[str, ...] | None
    tensor_split: tuple[float, ...]
    max_gpu: int
    reduce_type: str
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    n_depth: int
    n_prompt: int
    n_gen: int
    type_k: str = "f16"
    type_v: str = "f16"

    @property
    def name(self) -> str:
        """llama-bench's test names: pp512, tg128, pp512+tg128, with ' @ d4096' for a depth."""
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def load_key(self) -> tuple:
        """Settings fixed when a model is loaded: tests that share them share one load."""
        return (self.model, self.split_mode, self.main_gpu, self.devices, self.tensor_split, self.max_gpu,
                self.reduce_type, self.n_batch, self.n_ubatch, self.type_k, self.type_v)

    @property
    def n_ctx(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen


def expand(p: BenchParams) -> list[BenchTest]:
    tests = []
    for m, sm, mg, dev, ts, mx, rt, nb, nub, tk, tv, fa, nd in itertools.product(
            p.models, p.split_mode, p.main_gpu, p.devices, p.tensor_split, p.max_gpu, p.reduce_type, p.n_batch,
            p.n_ubatch, p.type_k, p.type_v, p.flash_attn, p.n_depth):
        shapes = [(n, 0) for n in p.n_prompt] + [(0, n) for n in p.n_gen] + list(p.n_pg)
        for n_prompt, n_gen in shapes:
            if n_prompt or n_gen:     # llama-bench skips -p 0 / -n 0 / -pg 0,0
                tests.append(BenchTest(m, sm, mg, dev, ts, mx, rt, nb, nub, fa, nd, n_prompt, n_gen, tk, tv))
    return tests


# ----------------------------------------------------------------------------------------------
# models: files, synthetic presets, and what llama-bench prints about them
# ----------------------------------------------------------------------------------------------

def resolve_model(name: str | None, note=None) -> Path:
    """The GGUF to load for a -m value: a file, synthetic:PRESET-TYPE[-ARCH], or None (default)."""
    if name is None:
        from .default_model import default_model_path
        return default_model_path()
    if name.lower().startswith(SYNTHETIC_PREFIX):
        from .synthetic import parse_synthetic_name, synthetic_model_path
        try:
            parse_synthetic_name(name)
        except LlamavkError as exc:
            raise UsageError(str(exc)) from None
        # Reuse is a stat; writing a large preset takes minutes: say so only when it takes a while.
        timer = threading.Timer(1.0, note or (lambda msg: None),
                                [f"{name}: writing its random-weight GGUF (once; later runs reuse it)"])
        timer.start()
        try:
            return synthetic_model_path(name)
        finally:
            timer.cancel()
    return check_model_path(Path(name).expanduser())


# llama.cpp's llama_model_ftype_name for general.file_type (llama_ftype values)
FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
               10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
               14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium",
               18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small",
               22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw",
               25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw", 28: "IQ2_S - 2.5 bpw",
               29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw", 32: "BF16",
               36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 38: "MXFP4 MoE"}
# llama.cpp's guess when general.file_type is missing: the most common tensor type -> llama_ftype
# (MXFP4 is not in its table at 0c1e570: such a file reads "(guessed) all F32" there too)
_GUESS_FTYPE = {"F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7,
                "Q2_K": 10, "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
                "IQ2_XXS": 19, "IQ2_XS": 20, "IQ2_S": 28, "IQ3_XXS": 23, "IQ3_S": 26, "IQ1_S": 24, "IQ1_M": 31,
                "TQ1_0": 36, "TQ2_0": 37}


@dataclass(frozen=True)
class ModelInfo:
    filename: str
    type: str         # "llama 7.2B Q4_0": architecture, size label, file type
    size: int         # bytes of tensor data (llama_model_size)
    n_params: int     # elements of all tensors (llama_model_n_params)
    n_layer: int = 0  # {arch}.block_count (checks -ngl)


def ftype_name(metadata: dict, tensor_types: list[str]) -> str:
    ftype = metadata.get("general.file_type")
    if ftype is not None:
        import gguf
        if not isinstance(ftype, int) or isinstance(ftype, bool):   # corrupt metadata: a label only
            return "unknown, may not work"
        try:
            fallback = gguf.LlamaFileType(ftype).name.removeprefix("MOSTLY_")
        except ValueError:
            fallback = "unknown, may not work"
        return FTYPE_NAMES.get(ftype, fallback)
    common = Counter(tensor_types).most_common(1)
    guess = _GUESS_FTYPE.get(common[0][0], 0) if common else 0
    return "(guessed) " + FTYPE_NAMES[guess]   # llama.cpp's order (0c1e570)


def model_info(path: Path) -> ModelInfo:
    """What llama-bench prints about a model, from the GGUF header alone (no tensor data is read)."""
    from gguf.utility import model_weight_count_rounded_notation

    from .gguf_file import read_header

    header = read_header(path)             # validates the file: one-line errors for bad ones
    entries = list(header.tensors.values())
    types = [e.qtype for e in entries]
    size = sum(e.nbytes for e in entries)
    n_params = sum(int(np.prod(e.shape)) for e in entries)
    meta = {k: v for k, v in header.metadata.items() if k.startswith("general.")}
    label = meta.get("general.size_label") or model_weight_count_rounded_notation(n_params)
    arch = meta.get("general.architecture", "?")
    n_layer = header.metadata.get(f"{arch}.block_count", 0)
    return ModelInfo(str(path), f"{arch} {label} {ftype_name(meta, [t.name for t in types])}", size, n_params,
                     n_layer if isinstance(n_layer, int) else 0)


# ----------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------

class Progress:
    """What a run reports while it works; the CLI shows it (llama-bench's lines or a rich bar).
    This base class shows nothing."""

    def begin(self, n_tests: int, n_reps: int) -> None:
        pass

    def event(self, index: int, n_tests: int, test: BenchTest, message: str) -> None:
        pass

    def rep_done(self) -> None:
        pass

    def end(self) -> None:
        pass


def _load(test: BenchTest, path: Path, n_ctx: int, verbose: bool = False, warn=None):
    """Load a model with a test's load settings, with room for `n_ctx` tokens."""
    from .api import load

    return load(path, devices=None if test.devices is None else ",".join(test.devices),
                split_mode=test.split_mode, tensor_split=list(test.tensor_split) or None, main_gpu=test.main_gpu,
                max_gpu=test.max_gpu or None, reduce_type=test.reduce_type, n_ctx=n_ctx, n_batch=test.n_batch,
                n_ubatch=test.n_ubatch, verbose=verbose, warn=warn, type_k=test.type_k, type_v=test.type_v)


# Decode steps of a warm-up. llama-bench decodes one; here the first timed tg128 of a model then read
# 1,204 +- 324 t/s where the second pass read 1,528 +- 3 (1.1B, H100), and 369.9 +- 95.0 against
# 425.1 (7.2B): a GPU's clocks come up over some tens of milliseconds of steady work.
WARMUP_DECODES = 64


def run_test(model, test: BenchTest, reps: int, warmup: bool, rng, say=lambda msg: None,
             rep_done=lambda: None) -> list[int]:
    """llama-bench's loop for one test: warm-up (a prompt, then up to WARMUP_DECODES decodes), then
    `reps` timed repetitions, each from an empty KV cache filled to the depth untimed. Returns
    nanoseconds."""
    from .benchmark import decode, fill_depth, prompt, timed

    if warmup:      # records the step shapes and wakes the GPU; nothing of it is timed
        if test.n_prompt:
            say("warmup prompt run")
            prompt(model, test.n_prompt, rng)
        if test.n_gen:
            say("warmup generation run")
            decode(model, min(test.n_gen, WARMUP_DECODES), rng, test.n_prompt)
            # the one-token steps the timed decodes take at their n_kv (a long context's form of the
            # decode attention is a recording of its own: Runtime.long_context_from)
            start = test.n_depth + test.n_prompt
            for n_kv in (start + 1, start + test.n_gen):
                model.runtime.record_decode(n_kv)
    what = ("prompt+generation" if test.n_prompt and test.n_gen
            else "prompt" if test.n_prompt else "generation")
    samples = []
    for r in range(1, reps + 1):
        if test.n_depth:
            say(f"depth run {r}/{reps}")
            fill_depth(model, test.n_depth, rng)
        say(f"{what} run {r}/{reps}")
        samples.append(timed(model, test.n_prompt, test.n_gen, test.n_depth, rng))
        rep_done()
    return samples


def check_devices(params: BenchParams, infos) -> None:
    """Every -dev value names known devices and every -mg fits it: fail before the first test."""
    from .devices import select

    for dev in params.devices:
        chosen, _ = select(infos, None if dev is None else ",".join(dev))
        bad = [mg for mg in params.main_gpu if mg >= len(chosen)]
        if bad:
            raise UsageError(f"-mg {bad[0]} is out of range: -dev {devices_text(dev)} selects {len(chosen)} device(s)")


def run_bench(params: BenchParams, write, progress: Progress | None = None, verbose: bool = False,
              warn=None, seed: int = 0) -> list[Result]:
    """Run every test of `params`, writing the chosen format through write(text) as tests finish.

    Inputs are checked before anything runs (models resolved, synthetic ones written, device
    names); the output is closed (json ']') even when a test fails or the run is interrupted."""
    from .devices import catalogue
    from .vk import get_instance

    progress = progress or Progress()
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    warned: set[str] = set()

    def warn_once(msg: str) -> None:   # every load repeats the device warnings
        if msg not in warned:
            warned.add(msg)
            warn(msg)

    infos = get_instance().devices
    check_devices(params, infos)
    paths = {m: resolve_model(m, warn) for m in dict.fromkeys(params.models)}
    models = {m: model_info(p) for m, p in paths.items()}
    for info in models.values():
        for n in params.gpu_layers:
            check_gpu_layers(n, info.n_layer)
    printer = PRINTERS[params.output](params, run_info([e.info.name for e in catalogue(infos) if not e.filtered]))
    tests = expand(params)
    rng = np.random.default_rng(seed)
    results: list[Result] = []
    write(printer.header())
    progress.begin(len(tests), params.repetitions)
    try:
        index = 0
        for _, group in itertools.groupby(tests, key=lambda t: t.load_key):
            group = list(group)
            first = group[0]
            progress.event(index + 1, len(tests), first, "loading the model")
            model = _load(first, paths[first.model], max(t.n_ctx for t in group), verbose, warn_once)
            with model:
                for test in group:
                    index += 1

                    def say(msg, i=index, t=test):
                        progress.event(i, len(tests), t, msg)

                    say("starting")
                    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    samples = run_test(model, test, params.repetitions, params.warmup, rng, say,
                                       progress.rep_done)
                    results.append(Result(test, models[test.model], samples, started))
                    write(printer.row(results[-1]))
    finally:
        progress.end()
        write(printer.footer())
    return results


__all__ = ["BenchParams", "BenchTest", "ModelInfo", "Progress", "parse_params", "parse_int_range", "expand",
           "resolve_model", "model_info", "run_test", "run_bench"]
