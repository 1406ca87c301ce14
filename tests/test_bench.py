"""`llamavk bench`: option parsing, combinations, timing semantics, output formats, real runs."""

import csv
import io
import json
import statistics
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from llamavk import bench
from llamavk.bench import (BenchParams, BenchTest, ModelInfo, expand, ftype_name, model_info, parse_int_range,
                           parse_params, run_test)
from llamavk.bench_format import PRINTERS, Result, RunInfo, format_params, format_size
from llamavk.cli import app
from llamavk.errors import LlamavkError, UsageError


# ----------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("512", [512]),
    ("1,2,4", [1, 2, 4]),
    ("1-4", [1, 2, 3, 4]),
    ("16-64+16", [16, 32, 48, 64]),
    ("16-64*2", [16, 32, 64]),
    ("16-60*2", [16, 32]),
    ("0,8-9", [0, 8, 9]),
])
def test_int_ranges(text, expected):
    assert parse_int_range(text, "-p") == expected


@pytest.mark.parametrize("text", ["", "x", "-5", "8-", "64-16", "1-8+0", "1-8*1", "0-8*2", "1-8/2", "1.5"])
def test_bad_int_ranges(text):
    with pytest.raises(UsageError):
        parse_int_range(text, "-p")


def test_defaults_are_llama_benchs():
    p = parse_params()
    assert (p.n_prompt, p.n_gen, p.n_pg, p.n_depth, p.n_batch, p.n_ubatch) == ([512], [128], [], [0], [2048], [512])
    assert (p.split_mode, p.main_gpu, p.devices, p.tensor_split) == (["layer"], [0], [None], [()])
    assert p.repetitions == 5 and p.output == "md" and p.warmup and p.models == [None]


def test_lists_repeats_and_per_flag_syntax():
    p = parse_params(model=["a.gguf,b.gguf", "c.gguf"], n_prompt=["16-64*2", "100"], n_gen=["0"],
                     pg=["512,128", "8,4"], n_depth=["0,4096"], ubatch=["256-512*2"],
                     split_mode=["none,Layer", "graph"], tensor_split=["3/1,1;1", "0"], main_gpu=["0,1"],
                     device=["Vulkan0/Vulkan0,auto"], flash_attn=["1"], max_gpu=["0-2"], reduce_type=["F32,bf16"],
                     repetitions=3, output="jsonl", no_warmup=True)
    assert p.models == ["a.gguf", "b.gguf", "c.gguf"]
    assert p.n_prompt == [16, 32, 64, 100] and p.n_gen == [0] and p.n_pg == [(512, 128), (8, 4)]
    assert p.n_depth == [0, 4096] and p.n_ubatch == [256, 512]
    assert p.split_mode == ["none", "layer", "graph"]
    assert p.tensor_split == [(3.0, 1.0), (1.0, 1.0), ()]
    assert p.main_gpu == [0, 1] and p.devices == [("Vulkan0", "Vulkan0"), None]
    assert p.max_gpu == [0, 1, 2] and p.reduce_type == ["f32", "bf16"]
    assert p.repetitions == 3 and p.output == "jsonl" and not p.warmup


def test_choices_and_defaults_are_the_engines():
    import inspect

    from llamavk import split
    from llamavk.api import Model

    assert bench.SPLIT_MODES == split.MODES and set(bench.REDUCE_TYPES) == set(split.REDUCE_TYPES)
    defaults = BenchParams()
    signature = inspect.signature(Model.__init__).parameters
    assert defaults.split_mode == [signature["split_mode"].default]
    assert defaults.reduce_type == [signature["reduce_type"].default]
    assert (defaults.n_batch, defaults.n_ubatch) == ([signature["n_batch"].default], [signature["n_ubatch"].default])


@pytest.mark.parametrize("kwargs,words", [
    (dict(split_mode=["split"]), "unknown split mode"),
    (dict(flash_attn=["0"]), "flash-attention"),
    (dict(flash_attn=["maybe"]), "-fa"),
    (dict(output="sql"), "unknown format"),
    (dict(repetitions=0), "-r"),
    (dict(pg=["512"]), "PP,TG"),
    (dict(n_prompt=["0"], n_gen=["0"]), "nothing to run"),
    (dict(tensor_split=["a/b"]), "-ts"),
    (dict(tensor_split=["-1/2"]), ">= 0"),
    (dict(device=["Vulkan0//Vulkan1"]), "empty device"),
    (dict(batch=["0"]), "minimum 1"),
    (dict(main_gpu=["x"]), "-mg"),
    (dict(reduce_type=["f8"]), "--reduce-type"),
])
def test_bad_options(kwargs, words):
    with pytest.raises(UsageError, match=words):
        parse_params(**kwargs)


# ----------------------------------------------------------------------------------------------
# combinations
# ----------------------------------------------------------------------------------------------

def test_every_combination_in_llama_bench_order():
    p = parse_params(model=["a,b"], split_mode=["none,layer"], n_prompt=["8,16"], n_gen=["4"], pg=["8,4"],
                     n_depth=["0,16"])
    tests = expand(p)
    assert len(tests) == 2 * 2 * 2 * 4
    assert len(set(tests)) == len(tests)
    # model outermost, then split mode, then depth; within a depth: pp tests, tg tests, pg tests
    assert [(t.model, t.split_mode, t.n_depth, t.name) for t in tests[:9]] == [
        ("a", "none", 0, "pp8"), ("a", "none", 0, "pp16"), ("a", "none", 0, "tg4"), ("a", "none", 0, "pp8+tg4"),
        ("a", "none", 16, "pp8 @ d16"), ("a", "none", 16, "pp16 @ d16"), ("a", "none", 16, "tg4 @ d16"),
        ("a", "none", 16, "pp8+tg4 @ d16"), ("a", "layer", 0, "pp8")]
    assert tests[-1].model == "b" and tests[-1].name == "pp8+tg4 @ d16"
    # tests of one model and split mode share a load; the model is loaded with room for the largest
    assert len({t.load_key for t in tests}) == 4
    assert max(t.n_ctx for t in tests) == 16 + 16      # pp16 @ d16


def test_zero_sizes_are_skipped_and_names():
    tests = expand(parse_params(n_prompt=["0,512"], n_gen=["0"], pg=["0,0", "512,128"], n_depth=["0,4096"]))
    assert [t.name for t in tests] == ["pp512", "pp512+tg128", "pp512 @ d4096", "pp512+tg128 @ d4096"]


# ----------------------------------------------------------------------------------------------
# model descriptions
# ----------------------------------------------------------------------------------------------

def test_size_and_params_as_llama_bench_prints_them():
    assert format_size(int(3.56 * 2**30) + 1000) == "3.56 GiB"
    assert format_size(96576768) == "92.10 MiB"
    assert format_params(7_241_732_096) == "7.24 B"
    assert format_params(135_000_000) == "135.00 M"
    assert format_params(999_999_999) == "1000.00 M"      # llama-bench switches at 1e9, not at rounding


def test_file_type_names():
    assert ftype_name({"general.file_type": 2}, []) == "Q4_0"
    assert ftype_name({"general.file_type": 15}, []) == "Q4_K - Medium"
    assert ftype_name({"general.file_type": 0}, []) == "all F32"
    assert ftype_name({}, ["F32", "Q6_K", "Q6_K"]) == "(guessed) Q6_K"
    # as llama-bench (0c1e570) printed them for synthetic tiny models of these types, with and
    # without general.file_type
    assert ftype_name({"general.file_type": 25}, []) == "IQ4_NL - 4.5 bpw"
    assert ftype_name({"general.file_type": 30}, []) == "IQ4_XS - 4.25 bpw"
    assert ftype_name({"general.file_type": 38}, []) == "MXFP4 MoE"
    assert ftype_name({}, ["F32", "IQ4_NL", "IQ4_NL"]) == "(guessed) IQ4_NL - 4.5 bpw"
    assert ftype_name({}, ["F32", "IQ4_XS", "IQ4_XS"]) == "(guessed) IQ4_XS - 4.25 bpw"
    assert ftype_name({}, ["F32", "MXFP4", "MXFP4"]) == "(guessed) all F32"
    # the lattice and ternary types, as llama-bench (0c1e570, -ngl 0) printed them for synthetic tiny models
    for ftype, tensor_type, name in ((19, "IQ2_XXS", "IQ2_XXS - 2.0625 bpw"), (20, "IQ2_XS", "IQ2_XS - 2.3125 bpw"),
                                     (28, "IQ2_S", "IQ2_S - 2.5 bpw"), (23, "IQ3_XXS", "IQ3_XXS - 3.0625 bpw"),
                                     (26, "IQ3_S", "IQ3_S - 3.4375 bpw"), (24, "IQ1_S", "IQ1_S - 1.5625 bpw"),
                                     (31, "IQ1_M", "IQ1_M - 1.75 bpw"), (36, "TQ1_0", "TQ1_0 - 1.69 bpw ternary"),
                                     (37, "TQ2_0", "TQ2_0 - 2.06 bpw ternary")):
        assert ftype_name({"general.file_type": ftype}, []) == name
        assert ftype_name({}, ["F32", tensor_type, tensor_type]) == f"(guessed) {name}"


def test_model_info_of_a_synthetic_model(synthetic_model):
    from llamavk.synthetic import synthetic_plan

    plan = synthetic_plan("tiny", "q4_0", "llama")
    info = model_info(synthetic_model("llama", "q4_0"))
    assert info.n_params == plan.n_params and info.size == plan.total_bytes
    assert info.type == "llama 150K Q4_0"      # no size label in the file: from the parameter count


@pytest.mark.parametrize("qtype,label", [("iq4_nl", "llama 150K IQ4_NL - 4.5 bpw"),
                                         ("iq4_xs", "llama 1.4M IQ4_XS - 4.25 bpw"),
                                         ("mxfp4", "llama 150K MXFP4 MoE")])
def test_model_type_of_iq4_and_mxfp4_models(synthetic_model, qtype, label):
    """llama-bench (0c1e570) printed "llama ?B <these names>" for the same synthetic files; run and
    perplexity -v print the file type the same way."""
    import llamavk
    from llamavk.cli.common import describe_model

    path = synthetic_model("llama", qtype)
    assert model_info(path).type == label
    with llamavk.load(path, n_ctx=32, warn=lambda m: None) as m:
        assert f"file type {label.split(' ', 2)[2]}," in describe_model(m)[0]


def test_model_info_of_smollm2(smollm2_path):
    info = model_info(smollm2_path)
    assert info.type == "llama 135M Q4_1"      # general.size_label and general.file_type
    assert format_size(info.size) == "92.10 MiB" and format_params(info.n_params) == "134.52 M"


# ----------------------------------------------------------------------------------------------
# output formats, on made-up results
# ----------------------------------------------------------------------------------------------

INFO = RunInfo("abc1234", "0.1.0", "Some CPU", "GPU A, GPU B")
MODEL = ModelInfo("/m/7b.gguf", "llama 7.2B Q4_0", int(3.56 * 2**30) + 1000, 7_241_732_096)


def results_for(params: BenchParams) -> list[Result]:
    out = []
    for i, t in enumerate(expand(params)):
        ns = [int(1e9 * (1 + 0.1 * (i + k))) for k in range(params.repetitions)]
        out.append(Result(t, MODEL, ns, "2025-01-01T00:00:00Z"))
    return out


def render(params: BenchParams) -> tuple[str, list[Result]]:
    results = results_for(params)
    printer = PRINTERS[params.output](params, INFO)
    return printer.header() + "".join(printer.row(r) for r in results) + printer.footer(), results


def md_table(text: str) -> list[list[str]]:
    lines = [l for l in text.splitlines() if l.startswith("|")]
    # llama-bench's widths are minimums (a long test name widens its cell), so count cells, not columns
    assert len({l.count("|") for l in lines}) == 1
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def test_markdown_default_columns():
    text, results = render(parse_params(n_prompt=["512"], n_gen=["128"], pg=["512,128"], n_depth=["0,4096"],
                                        repetitions=3))
    rows = md_table(text)
    assert rows[0] == ["model", "size", "params", "backend", "ngl", "sm", "test", "t/s"]
    assert rows[1][0] == "-" * 30 and rows[1][1] == "-" * 9 + ":"      # model left, numbers right
    body = rows[2:]
    assert [r[6] for r in body] == ["pp512", "tg128", "pp512+tg128", "pp512 @ d4096", "tg128 @ d4096",
                                    "pp512+tg128 @ d4096"]
    assert body[0][:6] == ["llama 7.2B Q4_0", "3.56 GiB", "7.24 B", "Vulkan", "99", "layer"]
    ts = results[2].samples_ts
    assert ts == pytest.approx([640 / 1.2, 640 / 1.3, 640 / 1.4])     # (512 + 128) tokens / seconds
    assert body[2][7] == f"{statistics.mean(ts):.2f} ± {statistics.stdev(ts):.2f}"
    assert text.rstrip().endswith("build: abc1234 (llamavk 0.1.0)")


def test_markdown_shows_non_default_settings():
    p = parse_params(n_prompt=["8"], n_gen=["0"], ubatch=["256,512"], main_gpu=["1"], device=["Vulkan0/Vulkan1"],
                     tensor_split=["3/1"], split_mode=["tensor"])
    rows = md_table(render(p)[0])
    assert rows[0] == ["model", "size", "params", "backend", "ngl", "n_ubatch", "main_gpu", "sm", "dev", "ts",
                       "test", "t/s"]
    assert [r[5:10] for r in rows[2:]] == [["256", "1", "tensor", "Vulkan0/Vulkan1", "3.00/1.00"],
                                          ["512", "1", "tensor", "Vulkan0/Vulkan1", "3.00/1.00"]]
    rows = md_table(render(parse_params(n_prompt=["8"], n_gen=["0"], split_mode=["graph"], max_gpu=["2"],
                                        reduce_type=["f16,f32"]))[0])
    assert rows[0][5:8] == ["sm", "max_gpu", "reduce_type"]
    assert [r[5:9] for r in rows[2:]] == [["graph", "2", "f16", "pp8"], ["graph", "2", "f32", "pp8"]]


def test_csv_holds_every_field_and_row():
    p = parse_params(n_prompt=["8,16"], n_gen=["4"], repetitions=2, output="csv")
    text, results = render(p)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 3 and text.splitlines()[0].startswith("build_commit,")
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [("8", "0"), ("16", "0"), ("0", "4")]
    r, res = rows[2], results[2]
    assert r["model_type"] == "llama 7.2B Q4_0" and r["backends"] == "Vulkan" and r["flash_attn"] == "1"
    assert r["split_mode"] == "layer" and r["devices"] == "auto" and r["tensor_split"] == "0.00"
    assert int(r["avg_ns"]) == int(statistics.mean(res.samples_ns))
    assert float(r["avg_ts"]) == pytest.approx(statistics.mean(res.samples_ts), abs=1e-6)
    assert float(r["stddev_ts"]) == pytest.approx(statistics.stdev(res.samples_ts), abs=1e-6)


def test_json_rows_carry_every_parameter_and_the_samples():
    p = parse_params(n_prompt=["8"], n_gen=["4"], pg=["8,4"], n_depth=["0,16"], repetitions=3, output="json")
    text, results = render(p)
    rows = json.loads(text)
    assert len(rows) == 6
    for row, res in zip(rows, results):
        t = res.test
        assert (row["n_prompt"], row["n_gen"], row["n_depth"]) == (t.n_prompt, t.n_gen, t.n_depth)
        assert row["samples_ns"] == res.samples_ns and row["samples_ts"] == pytest.approx(res.samples_ts)
        assert row["avg_ts"] == pytest.approx(statistics.mean(res.samples_ts))
        assert row["stddev_ns"] == int(statistics.stdev(res.samples_ns))
        for key in ("n_batch", "n_ubatch", "split_mode", "main_gpu", "devices", "tensor_split", "flash_attn",
                    "model_filename", "model_size", "model_n_params", "n_gpu_layers", "test_time", "gpu_info"):
            assert key in row
        assert isinstance(row["flash_attn"], bool) and isinstance(row["model_size"], int)


def test_jsonl_is_one_object_per_line():
    p = parse_params(n_prompt=["8"], n_gen=["4"], repetitions=1, output="jsonl")
    text, _ = render(p)
    rows = [json.loads(line) for line in text.splitlines()]
    assert [(r["n_prompt"], r["n_gen"], r["stddev_ts"]) for r in rows] == [(8, 0, 0.0), (0, 4, 0.0)]


# ----------------------------------------------------------------------------------------------
# what a repetition does, on a model that records its calls
# ----------------------------------------------------------------------------------------------

class FakeModel:
    """Records evaluations: ("eval", n_past, tokens) per prompt, ("step", n_past, token) per decode."""

    def __init__(self, add_bos: bool = True, fail_loads_after: int | None = None):
        from types import SimpleNamespace
        self.config = SimpleNamespace(n_vocab=100)
        self.tokenizer = SimpleNamespace(add_bos=add_bos, bos_id=1)
        self.runtime = SimpleNamespace(run_batch=lambda key, toks, n_past: self.calls.append(("step", n_past, toks[0])),
                                       record_decode=lambda n_kv: self.calls.append(("record", n_kv, None)),
                                       host_seconds=0.0)
        self.calls = []

    def _eval(self, tokens, n_past, all_logits, short_ok=True):
        assert not short_ok, "bench's prompts must run through their own steps, never token by token"
        self.calls.append(("eval", n_past, list(tokens)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def bench_test(**sizes) -> BenchTest:
    return BenchTest(model="m", split_mode="layer", main_gpu=0, devices=None, tensor_split=(), max_gpu=0,
                     reduce_type="f16", n_batch=2048, n_ubatch=512, flash_attn=True, **sizes)


def test_repetition_fills_depth_then_times_prompt_and_decodes():
    import numpy as np

    m = FakeModel()
    t = bench_test(n_depth=16, n_prompt=8, n_gen=3)
    samples = run_test(m, t, reps=2, warmup=True, rng=np.random.default_rng(0))
    assert len(samples) == 2 and all(ns > 0 for ns in samples)
    shape = [(kind, n_past, len(x) if kind == "eval" else 1) for kind, n_past, x in m.calls]
    warmup = [("eval", 0, 8), ("step", 8, 1), ("step", 9, 1), ("step", 10, 1),   # decodes as the test (<= 64)
              ("record", 25, 1), ("record", 27, 1)]     # then records the steps of the timed decodes' n_kv
    rep = [("eval", 0, 16), ("eval", 16, 8), ("step", 24, 1), ("step", 25, 1), ("step", 26, 1)]
    assert shape == warmup + rep + rep
    prompts = [x for kind, n_past, x in m.calls if kind == "eval"]
    assert all(p[0] == 1 for p in prompts)                                   # BOS first
    assert all(0 <= tok < 100 for p in prompts for tok in p)


def test_no_bos_when_the_model_adds_none_and_no_warmup():
    import numpy as np

    m = FakeModel(add_bos=False)
    run_test(m, bench_test(n_depth=0, n_prompt=64, n_gen=0), reps=3, warmup=False,
             rng=np.random.default_rng(0))
    assert [(kind, n_past) for kind, n_past, _ in m.calls] == [("eval", 0)] * 3
    assert any(c[2][0] != 1 for c in m.calls)


def test_output_is_closed_when_a_load_fails(monkeypatch, synthetic_model):
    """A json run that fails on its second model still writes a valid array of what finished."""
    loads = []

    def fake_load(test, path, n_ctx, verbose=False, warn=None):
        loads.append((test.split_mode, n_ctx))
        if len(loads) > 1:
            raise LlamavkError("out of device memory")
        return FakeModel()

    monkeypatch.setattr(bench, "_load", fake_load)
    p = parse_params(model=[str(synthetic_model("llama", "q4_0"))], split_mode=["none,layer"], n_prompt=["8"],
                     n_gen=["4"], repetitions=2, output="json")
    out = []
    with pytest.raises(LlamavkError, match="out of device memory"):
        bench.run_bench(p, out.append)
    rows = json.loads("".join(out))
    assert [(r["split_mode"], r["n_prompt"], r["n_gen"]) for r in rows] == [("none", 8, 0), ("none", 0, 4)]
    assert loads == [("none", 8), ("layer", 8)]     # room for the largest test: pp8


# ----------------------------------------------------------------------------------------------
# real runs
# ----------------------------------------------------------------------------------------------

def cli(*args, env=None):
    return CliRunner().invoke(app, ["bench", *args], env=env)


def test_real_run_on_smollm2(smollm2_path):
    r = subprocess.run([sys.executable, "-m", "llamavk", "bench", "-m", str(smollm2_path), "-p", "8", "-n", "4",
                        "-r", "2", "-o", "json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["n_prompt"], x["n_gen"]) for x in rows] == [(8, 0), (0, 4)]
    for x in rows:
        assert x["model_type"] == "llama 135M Q4_1" and x["model_size"] == 96576768
        assert len(x["samples_ns"]) == 2 and all(ts > 0 for ts in x["samples_ts"])
    assert "Traceback" not in r.stderr


def test_real_run_on_a_synthetic_model_all_test_kinds(synthetic_model):
    r = cli("-m", str(synthetic_model("llama", "q4_0")), "-p", "8", "-n", "4", "-pg", "8,4", "-d", "0,8",
            "-r", "2", "-o", "csv", "--progress")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["n_prompt"], x["n_gen"], x["n_depth"]) for x in rows] == [
        ("8", "0", "0"), ("0", "4", "0"), ("8", "4", "0"), ("8", "0", "8"), ("0", "4", "8"), ("8", "4", "8")]
    assert all(float(x["avg_ts"]) > 0 for x in rows)
    for line in ("benchmark 1/6: starting", "benchmark 1/6: warmup prompt run", "benchmark 4/6: depth run 2/2",
                 "benchmark 6/6: prompt+generation run 2/2"):
        assert line in r.stderr


def test_real_run_markdown_with_two_micro_batch_sizes(synthetic_model):
    r = cli("-m", str(synthetic_model("llama", "q4_0")), "-p", "16", "-n", "2", "-ub", "4,16", "-r", "1",
            "--no-warmup")
    assert r.exit_code == 0, r.stderr
    rows = md_table(r.stdout)
    assert rows[0][5] == "n_ubatch" and [(x[5], x[7]) for x in rows[2:]] == [("4", "pp16"), ("4", "tg2"),
                                                                             ("16", "pp16"), ("16", "tg2")]


def test_real_run_of_every_split_mode_on_virtual_devices(synthetic_model):
    r = cli("-m", str(synthetic_model("llama", "q4_0")), "-dev", "Vulkan0/Vulkan0", "-sm", "none,layer,row,tensor,graph",
            "-ts", "3/1", "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["split_mode"], x["n_prompt"], x["n_gen"]) for x in rows] == [
        (sm, n_prompt, n_gen) for sm in ("none", "layer", "row", "tensor", "graph") for n_prompt, n_gen in ((8, 0), (0, 2))]
    assert all(x["devices"] == "Vulkan0/Vulkan0" and x["tensor_split"] == "3.00/1.00" and x["avg_ts"] > 0 for x in rows)


def test_real_run_of_graph_mode_settings(synthetic_model):
    r = cli("-m", str(synthetic_model("llama", "q4_0")), "-dev", "Vulkan0/Vulkan0", "-sm", "graph", "--max-gpu", "0,1",
            "--reduce-type", "f32,f16", "-p", "40", "-n", "0", "-r", "1", "-o", "csv")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["max_gpu"], x["reduce_type"]) for x in rows] == [("0", "f32"), ("0", "f16"), ("1", "f32"), ("1", "f16")]


def test_synthetic_preset_is_generated_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    args = ("-m", "synthetic:tiny-q8_0", "-p", "4", "-n", "0", "-r", "1", "-o", "jsonl")
    first = cli(*args)
    assert first.exit_code == 0, first.stderr
    files = list((tmp_path / ".cache" / "llamavk" / "synthetic").glob("*.gguf"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    second = cli(*args)
    assert second.exit_code == 0, second.stderr
    assert files[0].stat().st_mtime_ns == stamp
    row = json.loads(second.stdout)
    assert row["model_type"].startswith("llama ") and row["model_type"].endswith(" Q8_0")
    assert row["model_filename"] == str(files[0])


def one_line_error(r, code):
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr


@pytest.mark.parametrize("args,code", [
    (("-m", "/nonexistent/model.gguf"), 1),
    (("-sm", "diagonal"), 2),
    (("-p", "64-16"), 2),
    (("-fa", "0"), 2),
    (("-m", "synthetic:huge-q4_0"), 2),
    (("-dev", "Vulkan9"), 2),
    (("-mg", "3"), 2),
    (("-o", "xml"), 2),
])
def test_bad_input_is_one_line_error(args, code, synthetic_model):
    if "-m" not in args:
        args = ("-m", str(synthetic_model("llama", "q4_0"))) + args
    one_line_error(cli(*args, "-p", "4", "-n", "0", "-r", "1") if args[-2] != "-p" else cli(*args), code)


def test_list_devices():
    r = cli("--list-devices")
    assert r.exit_code == 0 and r.stdout.startswith("Available devices:") and "Vulkan0: " in r.stdout


def test_ctrl_c_keeps_the_finished_rows_and_closes_the_json(synthetic_model, monkeypatch):
    real_run_test = bench.run_test
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run_test(*args, **kwargs)

    monkeypatch.setattr(bench, "run_test", interrupted)
    r = cli("-m", str(synthetic_model("llama", "q4_0")), "-p", "8", "-n", "2", "-r", "1", "-o", "json")
    assert r.exit_code == 130 and "Traceback" not in r.output
    assert [(x["n_prompt"], x["n_gen"]) for x in json.loads(r.stdout)] == [(8, 0)]


def test_build_commit_says_when_the_code_differs_from_it(tmp_path):
    """bench's build commit is the checkout's short HEAD, "-dirty" once a tracked file of llamavk/ or
    shaders/ differs from it (a tree copied onto another machine with an older .git, say); other files
    and untracked ones do not count; no checkout, no commit."""
    from llamavk.bench_format import _git_commit
    assert _git_commit(tmp_path) is None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "llamavk").mkdir()
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "llamavk" / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("r\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "c"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert _git_commit(tmp_path) == head
    (tmp_path / "README.md").write_text("changed\n")
    (tmp_path / "llamavk" / "new.py").write_text("y = 2\n")
    assert _git_commit(tmp_path) == head
    (tmp_path / "llamavk" / "a.py").write_text("x = 2\n")
    assert _git_commit(tmp_path) == head + "-dirty"
