"""llama.cpp's own tools as the oracle (../shared/ref-llamacpp, SPEC §7): locate, unpack, run, parse.

The CPU build (`-ngl 0`) scores any architecture llama.cpp knows, so a synthetic GGUF scored by both
engines checks llamavk against an implementation that shares none of its code. Where the reference
builds are not at hand (outside this workplace and its CI), `llamacpp_tool` skips with the reason.

Search order for the tarball `llamacpp-0c1e570-vk.tar.xz`: $LLAMAVK_REF_LLAMACPP (a folder holding it),
<repo>/../shared/ref-llamacpp (CI and the developers' checkouts), /work/shared/ref-llamacpp. It is
unpacked once into ~/.cache/llamavk/ (or $LLAMAVK_CACHE).
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = "llamacpp-0c1e570-vk"


def _tarball() -> Path | None:
    dirs = [os.environ.get("LLAMAVK_REF_LLAMACPP"), ROOT.parent / "shared" / "ref-llamacpp",
            "/work/shared/ref-llamacpp"]
    for d in dirs:
        if d and (Path(d) / f"{BUILD}.tar.xz").is_file():
            return Path(d) / f"{BUILD}.tar.xz"
    return None


def llamacpp_dir() -> Path | None:
    """The unpacked CPU/Vulkan build, or None where the tarball is not at hand."""
    cache = Path(os.environ.get("LLAMAVK_CACHE") or Path.home() / ".cache" / "llamavk")
    out = cache / BUILD
    if (out / "llama-perplexity").is_file():
        return out
    tar = _tarball()
    if tar is None:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{BUILD}.part"
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(tmp)
    (tmp / BUILD).rename(out)
    tmp.rmdir()
    return out


def llamacpp_tool(name: str) -> Path:
    """Path of a llama.cpp tool (llama-perplexity, llama-completion, llama-bench); skips the test
    with the reason where the reference build is not available."""
    d = llamacpp_dir()
    if d is None:
        pytest.skip(f"llama.cpp reference build {BUILD}.tar.xz not found (set LLAMAVK_REF_LLAMACPP to "
                    "the folder holding it; CI finds it in ../shared/ref-llamacpp)")
    return d / name


def run_tool(name: str, *args, timeout: float = 600) -> str:
    """Run a llama.cpp tool on the CPU (every layer on the CPU backend); returns stdout + stderr."""
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="")    # no Vulkan device: the CPU backend only
    r = subprocess.run([str(llamacpp_tool(name)), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                       errors="replace")     # tokens' pieces may be parts of a character
    out = r.stdout + r.stderr
    if r.returncode != 0:
        raise AssertionError(f"{name} failed ({r.returncode}):\n{out[-3000:]}")
    return out


# runs of a llama.cpp tool until its last lines come out (run_tool_until, llamacpp_perplexity_run)
RETRIES = 12


def run_tool_until(name: str, marker: str, *args, tries: int = RETRIES, timeout: float = 600) -> str:
    """run_tool, repeated until the output holds `marker`: llama.cpp logs from a thread of its own,
    and a process that ends quickly has been seen to lose its last lines (up to 3 runs in 10 of a
    tiny model's KL-divergence statistics on a busy machine)."""
    for _ in range(tries):
        out = run_tool(name, *args, timeout=timeout)
        if marker in out:
            return out
    raise AssertionError(f"no {marker!r} in {name}'s output after {tries} runs:\n{out[-3000:]}")


# a llama.cpp tool's whole environment where it must run on the CPU backend alone
CPU_ENV = {"GGML_VK_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
# printed by llama-completion -i (as its --in-prefix) when it waits for input: the text before it is out
WAITING = b"\x01\x02\x03"


def completion_until_waiting(cmd: list, timeout: float = 300) -> bytes | None:
    """stdout of llama-completion (`cmd`: the tool and its arguments; CPU backend) run interactive, up to
    where it first waits for input -- the reverse prompt, the end of text or -n tokens -- or None where
    it exited or `timeout` passed first. Why: it logs from a thread of its own, and a run that ends
    quickly (at a reverse prompt, in most runs) exits before the thread has written its text; one
    waiting for input has written all of it. Its stdin is held open until then, closed after."""
    import select
    import time

    p = subprocess.Popen([str(c) for c in cmd] + ["-i", "--in-prefix", WAITING.decode()], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=CPU_ENV)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while WAITING not in out and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], 1.0)[0]:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    finally:
        p.stdin.close()                  # EOF: it ends
        p.stdout.close()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return out.split(WAITING)[0] if WAITING in out else None


def llamacpp_prompt_tokens(model, *args) -> list[int]:
    """The prompt tokens llama-completion prints with --verbose-prompt (CPU build, one token made):
    the lines after "number of tokens in prompt", complete once the sampler line after them is out."""
    out = run_tool_until("llama-completion", "sampler seed", "-m", model, "-n", 1, "--temp", 0, "-ngl", 0,
                         "-t", 2, "--verbose-prompt", *args, timeout=300)
    count = int(re.search(r"number of tokens in prompt = (\d+)", out).group(1))
    tail = out[out.index("number of tokens in prompt"):]
    ids = [int(t) for t in re.findall(r"^\S+ I\s+(\d+) -> '", tail, re.M)]
    assert len(ids) >= count, out[-3000:]
    return ids[:count]


FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
RUNNING = re.compile(r"\[(\d+)\]([0-9.]+),")


def llamacpp_perplexity(model: Path, text_file: Path, n_ctx: int, chunks: int = -1, *extra) -> tuple[float, float]:
    """llama-perplexity on the CPU: (PPL, uncertainty) of `Final estimate`."""
    ppl, unc, _ = llamacpp_perplexity_run(model, text_file, n_ctx, chunks, *extra)
    return ppl, unc


def llamacpp_perplexity_run(model: Path, text_file: Path, n_ctx: int, chunks: int = -1,
                            *extra) -> tuple[float, float, list[float]]:
    """llama-perplexity on the CPU: (PPL, uncertainty, running PPL after each chunk)."""
    # llama.cpp logs from a thread of its own: a busy machine has been seen to lose the last lines
    # at exit (once in several hundred runs; CI once lost all but the first lines of three runs of
    # another tool in a row; with 3 busy processes on 2 cores, 5 runs in a row of each of two files),
    # so a run without them is repeated.
    for _ in range(RETRIES):
        out = run_tool("llama-perplexity", "-m", model, "-f", text_file, "-c", n_ctx, "--chunks", chunks,
                       "-ngl", 0, "-t", 2, *extra)
        m = FINAL.search(out)
        if m is not None:
            running = [float(v) for _, v in sorted(RUNNING.findall(out), key=lambda iv: int(iv[0]))]
            return float(m.group(1)), float(m.group(2)), running
    raise AssertionError(f"no final estimate in llama-perplexity's output:\n{out[-3000:]}")
