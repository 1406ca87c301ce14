"""KL-divergence base files in llama.cpp's format and llama-perplexity's statistics: the layout
against the format's definition, the statistics against a float64 numpy computation, and both
directions against llama-perplexity itself (a base written by one engine compared in the other)."""

import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError
from llamavk.kld import KLDBase, KLDBaseWriter, decode_rows, encode_rows, row_words
from llamavk.kld_stats import KLDStats, report
from llamavk.perplexity import read_text

from .llamacpp_ref import run_tool, run_tool_until


def cli(*args):
    return subprocess.run([sys.executable, "-m", "llamavk", "perplexity", *map(str, args)], capture_output=True,
                          text=True, timeout=900)


# -- the file format ---------------------------------------------------------------------------------

def reference_row(logits, n_vocab):
    """One stored row, element by element in float32, from the format's definition: log-probs over
    the 16 nats below the top one, in 65535 steps; anything lower stored as step 0."""
    f = np.float32
    x = [f(v) for v in logits]
    top, low = max(x), max(min(x), max(x) - f(16))
    total = 0.0
    for v in x:
        total += float(np.exp(v - top))
    log_sum = f(np.log(total))
    scale = (top - low) / f(65535)
    words = list(np.array([scale, (low - top) - log_sum], dtype="<f4").view("<u2"))
    for v in x:
        words.append(int(np.rint((f(1) / scale) * (v - low))) if v > low else 0)
    words += [0] * (row_words(n_vocab) - len(words))
    return np.array(words, dtype="<u2")


def test_base_file_layout(tmp_path):
    """Header, tokens as given (not BOS-substituted), rows of 2*ceil(n/2)+4 words: n_vocab 7 -> 12
    words, the last one a zero pad."""
    rng = np.random.default_rng(0)
    n_vocab, n_ctx, n_chunks = 7, 8, 2
    tokens = [int(t) for t in rng.integers(0, n_vocab, n_ctx * n_chunks + 3)]
    path = tmp_path / "base.kld"
    scored = n_ctx - 1 - n_ctx // 2
    logits = rng.normal(0, 4, (n_chunks * scored, n_vocab)).astype(np.float32)
    logits[0, 3] = 30.0                      # a row with entries more than 16 nats down
    with KLDBaseWriter(path, n_ctx, n_vocab, n_chunks, tokens) as w:
        for c in range(n_chunks):
            w.add(logits[c * scored:(c + 1) * scored], np.zeros(scored, dtype=int))
    data = path.read_bytes()
    assert data[:8] == b"_logits_"
    assert struct.unpack("<3i", data[8:20]) == (n_ctx, n_vocab, n_chunks)
    assert list(struct.unpack(f"<{n_ctx * n_chunks}i", data[20:20 + 4 * n_ctx * n_chunks])) == tokens[:n_ctx * n_chunks]
    rows = np.frombuffer(data[20 + 4 * n_ctx * n_chunks:], dtype="<u2").reshape(-1, 12)
    assert rows.shape == (n_chunks * scored, 12) and (rows[:, 11] == 0).all()
    for r in range(len(rows)):
        np.testing.assert_array_equal(rows[r], reference_row(logits[r], n_vocab), err_msg=f"row {r}")
    assert rows[0, 4 + 3] == 65535 and (rows[0, 4:11][np.arange(7) != 3] == 0).all()
    # decoded: within half a step of the exact log-probs (rows whose range is under 16 nats)
    exact = logits - np.log(np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True))
    step = rows[:, :4].copy().view("<f4")[:, 0]
    err = np.abs(decode_rows(rows, n_vocab) - exact)[1:]
    assert (err <= step[1:, None] * 0.51 + 1e-5).all()


def test_encode_nll_and_flat_rows():
    logits = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]], dtype=np.float32)
    words, nll = encode_rows(logits, np.array([1, 2]))
    want = -(logits[[0, 1], [1, 2]] - np.log(np.exp(logits.astype(np.float64)).sum(axis=1)))
    np.testing.assert_allclose(nll, want, rtol=1e-6)
    scale, low = words[1, :4].copy().view("<f4")
    assert scale == 0 and (words[1, 4:] == 0).all() and low == pytest.approx(-np.log(4), rel=1e-6)


def test_base_file_errors(tmp_path):
    def expect(data: bytes, message: str):
        path = tmp_path / "b.kld"
        path.write_bytes(data)
        with pytest.raises(LlamavkError, match=message):
            KLDBase(path)

    head = b"_logits_" + struct.pack("<3i", 8, 9, 1)
    tokens = struct.pack("<8i", *range(8))
    rows = b"\0" * (3 * 2 * row_words(9))
    expect(b"nonsense" * 4, "is not a KL-divergence base file")
    expect(b"_logits_", "is not a KL-divergence base file")
    expect(b"_logits_" + struct.pack("<3i", 8, 9, 0) + tokens, "bad header")
    expect(b"_logits_" + struct.pack("<3i", 8, 9, 1 << 30), "is truncated")
    expect(head + tokens + rows[:-1], "is truncated")
    expect(head + struct.pack("<8i", 0, 1, 2, 3, 4, 5, 6, 9) + rows, "token id 9 is outside its vocabulary of 9")
    (tmp_path / "b.kld").write_bytes(head + tokens + rows)
    with KLDBase(tmp_path / "b.kld") as b:
        assert (b.n_ctx, b.n_vocab, b.n_chunks, b.scored, b.tokens) == (8, 9, 1, 3, list(range(8)))


def test_cli_base_file_errors_are_one_line(synthetic_model, tmp_path):
    bad = tmp_path / "bad.kld"
    bad.write_bytes(b"nonsense" * 10)
    r = cli("-m", synthetic_model("llama", "q4_0"), "--kl-divergence-base", bad, "--kl-divergence")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert [l for l in r.stderr.splitlines() if l.startswith("error:")] == [
        f"error: {bad} is not a KL-divergence base file (llama-perplexity --kl-divergence-base)"]
    other_vocab = tmp_path / "v.kld"
    other_vocab.write_bytes(b"_logits_" + struct.pack("<3i", 8, 5, 1) + bytes(32) + bytes(3 * 2 * row_words(5)))
    r = cli("-m", synthetic_model("llama", "q4_0"), "--kl-divergence-base", other_vocab, "--kl-divergence")
    assert r.returncode == 1 and "the base file has 5 vocabulary entries, this model 500" in r.stderr
    r = cli("-m", synthetic_model("llama", "q4_0"), "--kl-divergence")
    assert r.returncode == 2 and "needs --kl-divergence-base" in r.stderr


# -- the statistics ------------------------------------------------------------------------------------

def test_statistics_against_numpy():
    """KLD, Δp, same top, PPLs and percentiles against float64 numpy over the stored distribution."""
    rng = np.random.default_rng(5)
    rows, n_vocab = 150, 300
    base_logits = rng.normal(0, 3, (rows, n_vocab)).astype(np.float32)
    q_logits = (base_logits + rng.normal(0, 0.3, (rows, n_vocab))).astype(np.float32)
    targets = rng.integers(0, n_vocab, rows)
    words, _ = encode_rows(base_logits, targets)
    stats = KLDStats()
    stats.add(q_logits[:70], targets[:70], words[:70])
    stats.add(q_logits[70:], targets[70:], words[70:])
    r = stats.result()

    lb = decode_rows(words, n_vocab).astype(np.float64)
    x = q_logits.astype(np.float64)
    lq = x - x.max(axis=1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(axis=1, keepdims=True))
    kld = np.where(lb > -16, np.exp(lb) * (lb - lq), 0).sum(axis=1)
    idx = np.arange(rows)
    nll, nll_base = -lq[idx, targets], -lb[idx, targets]
    dp = np.exp(-nll) - np.exp(-nll_base)
    assert r.count == rows
    assert r.kld_mean == pytest.approx(kld.mean(), rel=1e-5)
    assert r.kld_unc == pytest.approx(kld.std(ddof=0) / np.sqrt(rows - 1), rel=1e-3)
    for f in (0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001):
        assert r.kld_percentiles[f] == pytest.approx(np.percentile(kld, 100 * f), rel=1e-4, abs=1e-6)
    assert r.kld_median == pytest.approx(np.median(kld), rel=1e-5, abs=1e-6)
    assert (r.kld_max, r.kld_min) == pytest.approx((kld.max(), kld.min()), rel=1e-5, abs=1e-6)
    assert r.ppl_q == pytest.approx(np.exp(nll.mean()), rel=1e-6)
    assert r.ppl_base == pytest.approx(np.exp(nll_base.mean()), rel=1e-6)
    assert r.ln_ppl_cor == pytest.approx(np.corrcoef(nll, nll_base)[0, 1], rel=1e-4)
    assert r.dp_mean == pytest.approx(dp.mean(), rel=1e-4, abs=1e-8)
    assert r.dp_percentiles[0.75] == pytest.approx(np.percentile(dp, 75), rel=1e-4, abs=1e-7)
    assert r.rms_dp == pytest.approx(np.sqrt((dp ** 2).mean()), rel=1e-5)
    assert r.same_top == (x.argmax(axis=1) == lb.argmax(axis=1)).mean()
    lines = report(r)
    assert lines[0] == "====== Perplexity statistics ======" and lines[-1].startswith("Same top p: ")
    assert f"Mean    KLD: {r.kld_mean:10.6f} ± {r.kld_unc:10.6f}" in lines
    assert stats.chunk_line(3).startswith("   3" + "    %9.4f ± " % r.ppl_q)
    stats.count = 99
    assert report(stats.result()) == []              # llama-perplexity: no statistics below 100 tokens


def test_cli_base_against_itself_and_another_model(synthetic_model, tmp_path):
    """A base written and compared by llamavk: the per-chunk table, then the statistics; against
    itself only the stored rounding remains; another model's distributions differ."""
    words = tmp_path / "words.txt"
    rng = np.random.default_rng(2)
    words.write_text(" ".join("".join(rng.choice(list("abcdefghij"), rng.integers(2, 7))) for _ in range(200)))
    base = tmp_path / "base.kld"
    a, b = synthetic_model("llama", "q8_0", seed=1), synthetic_model("llama", "q8_0", seed=2)
    r = cli("-m", a, "-f", words, "-c", "64", "--chunks", "4", "--kl-divergence-base", base)
    assert r.returncode == 0, r.stderr
    same = cli("-m", a, "--kl-divergence-base", base, "--kl-divergence")
    assert same.returncode == 0, same.stderr
    out = same.stdout.splitlines()
    assert out[:2] == ["", "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                           "              Δp RMS            Same top p"]
    assert [l.split()[0] for l in out[2:6]] == ["1", "2", "3", "4"] and out[6] == ""
    final = float(r.stdout.splitlines()[-1].split("=")[1].split("+/-")[0])
    assert float(out[5].split()[1]) == pytest.approx(final, rel=1e-5)       # the same PPL(Q)
    s = stats_of(same.stdout)
    assert abs(s["Mean    KLD"]) < 1e-5 and s["Same top p"] == 100.0 and s["RMS Δp"] < 0.01
    other = stats_of(cli("-m", b, "--kl-divergence-base", base, "--kl-divergence").stdout)
    assert other["Mean    KLD"] > 0.05 and other["Same top p"] < 100.0


def stats_of(stdout: str) -> dict[str, float]:
    """'label: value' lines of the statistics blocks (the first number after the colon)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^([^:]+):\s*(-?[0-9.]+)", line)
        if m and not line.startswith("chunk"):
            out[m.group(1).strip()] = float(m.group(2))
    return out


# -- against llama-perplexity ----------------------------------------------------------------------------

def llamacpp(*args):
    """llama-perplexity on the CPU; a KL-divergence comparison is rerun until its statistics came out."""
    if "--kl-divergence" in args:
        return run_tool_until("llama-perplexity", "Same top p:", *args, "-ngl", 0, "-t", 2)
    return run_tool("llama-perplexity", *args, "-ngl", 0, "-t", 2)


def assert_same_header_and_tokens(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        ha, hb = fa.read(20), fb.read(20)
        assert ha == hb
        n_ctx, _, n_chunks = struct.unpack("<3i", ha[8:])
        assert fa.read(4 * n_ctx * n_chunks) == fb.read(4 * n_ctx * n_chunks)
    assert a.stat().st_size == b.stat().st_size


def base_ppl(path) -> float:
    """exp(mean NLL of the text's tokens) under a base file's stored distributions alone."""
    with KLDBase(path) as b:
        nll = []
        first = b.n_ctx // 2
        for c in range(b.n_chunks):
            lp = decode_rows(b.read_rows(b.scored), b.n_vocab).astype(np.float64)
            nll += list(-lp[np.arange(b.scored), b.tokens[c * b.n_ctx + first + 1:(c + 1) * b.n_ctx]])
    return float(np.exp(np.mean(nll)))


def test_both_directions_with_llamacpp_on_a_bos_model(synthetic_model, tmp_path):
    """A synthetic model that adds BOS (each chunk's first token replaced when evaluated, the file
    keeps the text's): llama.cpp's base compared in llamavk and llamavk's in llama.cpp."""
    model = synthetic_model("llama", "q8_0", seed=3)
    words = tmp_path / "words.txt"
    rng = np.random.default_rng(7)
    words.write_text(" ".join("".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 7))) for _ in range(300)))
    theirs, ours = tmp_path / "llamacpp.kld", tmp_path / "llamavk.kld"
    llamacpp("-m", model, "-f", words, "-c", 64, "--chunks", 4, "--kl-divergence-base", theirs)
    r = cli("-m", model, "-f", words, "-c", "64", "--chunks", "4", "--kl-divergence-base", ours)
    assert r.returncode == 0, r.stderr
    assert_same_header_and_tokens(theirs, ours)
    with KLDBase(ours) as b:
        assert b.tokens[0] == 1 and 1 not in b.tokens[1:]     # the text's BOS only: chunks keep their own first tokens

    ours_vs_theirs = cli("-m", model, "--kl-divergence-base", theirs, "--kl-divergence")
    assert ours_vs_theirs.returncode == 0, ours_vs_theirs.stderr
    theirs_vs_theirs = llamacpp("-m", model, "-c", 64, "--kl-divergence-base", theirs, "--kl-divergence")
    theirs_vs_ours = llamacpp("-m", model, "-c", 64, "--kl-divergence-base", ours, "--kl-divergence")
    a, b = stats_of(ours_vs_theirs.stdout), stats_of(theirs_vs_ours)
    # the base side is read identically: the same PPL(base), to every printed digit
    assert line_of(ours_vs_theirs.stdout, "Mean PPL(base)") == line_of(theirs_vs_theirs, "Mean PPL(base)")
    assert b["Mean PPL(base)"] == pytest.approx(base_ppl(ours), abs=1e-6)
    # the same statistics blocks, line for line
    assert labels(ours_vs_theirs.stdout) == labels(theirs_vs_theirs)
    print(f"llamavk vs llama.cpp's base: KLD {a['Mean    KLD']}, same top {a['Same top p']}%; "
          f"llama.cpp vs llamavk's: KLD {b['Mean    KLD']}, same top {b['Same top p']}%")
    for s in (a, b):
        assert s["Mean    KLD"] < 0.01 and s["Same top p"] >= 90.0


def line_of(stdout: str, label: str) -> str:
    return next(l for l in stdout.splitlines() if l.startswith(label))


def labels(stdout: str) -> list[str]:
    """The statistics blocks' line labels (text before ':'), from the first block's title to the
    last line ("Same top p")."""
    block = stdout[stdout.index("====== Perplexity statistics"):]
    block = block[:block.index("Same top p")]
    return [l.split(":")[0] for l in block.splitlines()] + ["Same top p"]


def test_smollm2_botchan_both_directions(smollm2_path, botchan_text, tmp_path):
    """Issue 26's acceptance: SmolLM2 on botchan, -c 128 --chunks 4. One llamavk pass compares with
    llama.cpp's base and writes its own, which llama.cpp then compares. Measured: llamavk vs
    llama.cpp's base mean KLD 0.0067, same top 95.2%; PPL(base) 24.732770 as llama.cpp reads it."""
    text = tmp_path / "botchan.txt"
    text.write_text(botchan_text)
    theirs, ours = tmp_path / "llamacpp.kld", tmp_path / "llamavk.kld"
    llamacpp("-m", smollm2_path, "-f", text, "-c", 128, "--chunks", 4, "--kl-divergence-base", theirs)
    stats = KLDStats()
    with KLDBase(theirs) as base, llamavk.load(smollm2_path, n_ctx=512, warn=lambda m: None) as m:
        assert base.n_ctx == 128 and base.n_chunks == 4

        def compare(logits, targets):
            stats.add(logits, targets, base.read_rows(len(logits)))

        m.perplexity(read_text(text), 128, 4, on_scored=compare, kl_divergence_base=ours)
    mine = stats.result()
    assert_same_header_and_tokens(theirs, ours)
    out = llamacpp("-m", smollm2_path, "-c", 128, "--kl-divergence-base", ours, "--kl-divergence")
    s = stats_of(out)
    print(f"llamavk vs llama.cpp's base: KLD {mine.kld_mean:.6f}, same top {100 * mine.same_top:.2f}%, PPL(base) "
          f"{mine.ppl_base:.6f}; llama.cpp vs llamavk's: KLD {s['Mean    KLD']}, same top {s['Same top p']}%")
    assert mine.kld_mean < 0.01 and mine.same_top >= 0.90
    assert s["Mean    KLD"] < 0.01 and s["Same top p"] >= 90.0
    assert s["Mean PPL(base)"] == pytest.approx(base_ppl(ours), abs=1e-6)
    assert mine.ppl_base == pytest.approx(base_ppl(theirs), rel=1e-7)
