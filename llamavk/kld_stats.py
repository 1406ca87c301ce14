"""llama-perplexity's KL-divergence statistics: this run's logits against a base file's stored
log-probabilities (kld.py), token by token, and the lines it prints.

Per scored token, as llama-perplexity computes them (single precision per token, sums in double):
- NLL of the text's next token under this model (Q) and under the base (from the stored row);
- KL(base || Q) = sum over the vocabulary of p_base * (log p_base - log p_Q), entries the base
  stored as less likely than e^-16 left out (the stored distribution is not renormalized, so a
  model compared with its own base gives about +-1e-6, not 0);
- Δp = p_Q(next token) - p_base(next token); whether both put the same token on top (first
  maximum wins, as in C).
Statistics follow llama-perplexity: mean ± uncertainty only above 10 tokens, percentiles by linear
interpolation in single precision, and the closing blocks only from 100 tokens on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kld import LOG_PROB_RANGE, _exp_sum, decode_rows

ROWS_PER_STEP = 32             # bounds the [rows, n_vocab] temporaries (large vocabularies)
KLD_HIGH = (("99.9%  ", 0.999), ("99.0%  ", 0.990), ("95.0%  ", 0.950), ("90.0%  ", 0.900))
KLD_LOW = (("10.0%  ", 0.100), (" 5.0%  ", 0.050), (" 1.0%  ", 0.010), (" 0.1%  ", 0.001))
DP_HIGH = (("99.9%  ", 0.999), ("99.0%  ", 0.990), ("95.0%  ", 0.950), ("90.0%  ", 0.900), ("75.0%  ", 0.750))
DP_LOW = (("25.0%  ", 0.250),) + KLD_LOW
CHUNK_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
                "Δp RMS            Same top p")


def _mean_unc(total: float, total2: float, n: int) -> tuple[float, float]:
    """Mean and its uncertainty; no uncertainty up to 10 values (llama-perplexity's rule)."""
    if n < 1:
        return 0.0, 0.0
    mean = total / n
    var = total2 / n - mean * mean
    return mean, float(np.sqrt(var / (n - 1))) if var > 0 and n > 10 else 0.0


def _covariance(ta: float, tb: float, tab: float, n: int) -> float:
    if n < 10:
        return 0.0
    return (tab / n - (ta / n) * (tb / n)) / (n - 1)


def _percentile(values: np.ndarray, fraction: float) -> np.float32:
    """Linear interpolation between sorted values, in single precision."""
    if fraction <= 0:
        return values[0]
    if fraction >= 1:
        return values[-1]
    p = np.float32(fraction) * np.float32(len(values) - 1)
    i = int(p)
    p = p - np.float32(i)
    return (np.float32(1) - p) * values[i] + p * values[min(i + 1, len(values) - 1)]


def _median(values: np.ndarray) -> np.float32:
    n = len(values)
    return values[n // 2] if n % 2 else np.float32(0.5) * (values[n // 2] + values[n // 2 - 1])


@dataclass
class KLDivergenceResult:
    """The numbers llama-perplexity prints after --kl-divergence (uncertainties as `*_unc`)."""
    count: int
    ppl_q: float
    ppl_q_unc: float
    ppl_base: float
    ppl_base_unc: float
    ln_ppl_cor: float
    ln_ppl_ratio: float
    ln_ppl_ratio_unc: float
    ppl_ratio: float
    ppl_ratio_unc: float
    ppl_diff: float
    ppl_diff_unc: float
    kld_mean: float
    kld_unc: float
    kld_max: float
    kld_median: float
    kld_min: float
    kld_percentiles: dict[float, float]       # fraction (0.999 ... 0.001) -> value
    dp_mean: float                             # fractions, not percent
    dp_unc: float
    dp_max: float
    dp_median: float
    dp_min: float
    dp_percentiles: dict[float, float]
    rms_dp: float
    rms_dp_unc: float
    same_top: float
    same_top_unc: float
    kld_values: np.ndarray = field(repr=False, default=None)   # per token, float32, sorted


class KLDStats:
    """Accumulates llama-perplexity's sums chunk by chunk (`add`), prints its per-chunk line
    (`chunk_line`) and its closing statistics (`result`; `report` prints them)."""

    def __init__(self):
        self.sum_nll = self.sum_nll2 = self.sum_nll_base = self.sum_nll_base2 = self.sum_nll_nll_base = 0.0
        self.sum_kld = self.sum_kld2 = self.sum_p_diff = self.sum_p_diff2 = self.sum_p_diff4 = 0.0
        self.n_same_top = self.count = 0
        self._kld: list[np.ndarray] = []
        self._p_diff: list[np.ndarray] = []

    def add(self, logits: np.ndarray, targets: np.ndarray, base_words: np.ndarray) -> None:
        """Score rows of this run's logits against the same positions' stored rows."""
        for s in range(0, len(logits), ROWS_PER_STEP):
            self._add(np.asarray(logits[s:s + ROWS_PER_STEP], dtype=np.float32),
                      np.asarray(targets[s:s + ROWS_PER_STEP]), base_words[s:s + ROWS_PER_STEP])

    def _add(self, x: np.ndarray, targets: np.ndarray, base_words: np.ndarray) -> None:
        rows, n_vocab = x.shape
        idx = np.arange(rows)
        top_id = x.argmax(axis=1)
        top = x[idx, top_id]
        norm = top + np.log(_exp_sum(x, top)).astype(np.float32)          # log of the softmax's sum
        base = decode_rows(base_words, n_vocab)
        nll = norm - x[idx, targets]
        nll_base = -base[idx, targets]
        self.sum_nll += float(nll.sum(dtype=np.float64))
        self.sum_nll2 += float((nll * nll).sum(dtype=np.float64))
        self.sum_nll_base += float(nll_base.sum(dtype=np.float64))
        self.sum_nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.sum_nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        with np.errstate(under="ignore"):
            terms = np.exp(base) * ((base - x) + norm[:, None])
        kld = np.where(base > np.float32(-LOG_PROB_RANGE), terms, np.float32(0)).sum(axis=1, dtype=np.float64)
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        self.n_same_top += int((top_id == base.argmax(axis=1)).sum())
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        p_diff2 = (p_diff * p_diff).astype(np.float64)
        self.sum_p_diff += float(p_diff.sum(dtype=np.float64))
        self.sum_p_diff2 += float(p_diff2.sum())
        self.sum_p_diff4 += float((p_diff2 * p_diff2).sum())
        self.count += rows
        self._kld.append(kld.astype(np.float32))
        self._p_diff.append(p_diff.astype(np.float32))

    def _ppl_ratio(self) -> tuple[tuple, tuple, float, float, float]:
        log_ppl = _mean_unc(self.sum_nll, self.sum_nll2, self.count)
        log_base = _mean_unc(self.sum_nll_base, self.sum_nll_base2, self.count)
        cov = _covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count)
        ratio = log_ppl[0] - log_base[0]
        with np.errstate(invalid="ignore"):
            ratio_unc = float(np.sqrt(np.float64(log_ppl[1] ** 2 + log_base[1] ** 2 - 2.0 * cov)))
        return log_ppl, log_base, cov, ratio, ratio_unc

    def _rms_dp(self) -> tuple[float, float]:
        mse = _mean_unc(self.sum_p_diff2, self.sum_p_diff4, self.count)
        rms = float(np.sqrt(mse[0]))
        with np.errstate(divide="ignore", invalid="ignore"):
            return rms, float(np.float64(0.5) / np.float64(rms) * np.float64(mse[1]))

    def _same_top(self) -> tuple[float, float]:
        p = self.n_same_top / self.count
        with np.errstate(divide="ignore", invalid="ignore"):
            return p, float(np.sqrt(np.float64(p * (1 - p)) / np.float64(self.count - 1)))

    def chunk_line(self, chunk: int) -> str:
        """llama-perplexity's running line after `chunk` (1-based) chunks."""
        log_ppl, _, _, ratio, ratio_unc = self._ppl_ratio()
        ppl = float(np.exp(log_ppl[0]))
        kld = _mean_unc(self.sum_kld, self.sum_kld2, self.count)
        rms, rms_unc = self._rms_dp()
        top, top_unc = self._same_top()
        return (f"{chunk:4d}" + "    %9.4f ± %9.4f" % (ppl, ppl * log_ppl[1])
                + "    %10.5f ± %10.5f" % (ratio, ratio_unc) + "    %10.5f ± %10.5f" % kld
                + "    %6.3f ± %6.3f %%" % (100 * rms, 100 * rms_unc)
                + "    %6.3f ± %6.3f %%" % (100 * top, 100 * top_unc))

    def result(self) -> KLDivergenceResult:
        if self.count == 0:
            raise ValueError("no tokens compared")
        kld = np.sort(np.concatenate(self._kld))
        dp = np.sort(np.concatenate(self._p_diff))
        log_ppl, log_base, cov, ratio, ratio_unc = self._ppl_ratio()
        ppl, ppl_base = float(np.exp(log_ppl[0])), float(np.exp(log_base[0]))
        ppl_unc, base_unc = ppl * log_ppl[1], ppl_base * log_base[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            cor = float(np.float64(cov) / (np.float64(log_ppl[1]) * np.float64(log_base[1])))
            diff_unc = float(np.sqrt(np.float64(ppl_unc ** 2 + base_unc ** 2 - 2.0 * ppl * ppl_base * cov)))
        kld_mean = _mean_unc(self.sum_kld, self.sum_kld2, self.count)
        dp_mean = _mean_unc(self.sum_p_diff, self.sum_p_diff2, self.count)
        rms, rms_unc = self._rms_dp()
        top, top_unc = self._same_top()
        fractions = (0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001)
        return KLDivergenceResult(
            self.count, ppl, ppl_unc, ppl_base, base_unc, cor, ratio, ratio_unc, float(np.exp(ratio)),
            float(np.exp(ratio)) * ratio_unc, ppl - ppl_base, diff_unc, kld_mean[0], kld_mean[1],
            float(kld[-1]), float(_median(kld)), float(kld[0]), {f: float(_percentile(kld, f)) for f in fractions},
            dp_mean[0], dp_mean[1], float(dp[-1]), float(_median(dp)), float(dp[0]),
            {f: float(_percentile(dp, f)) for f in fractions + (0.75, 0.25)}, rms, rms_unc, top, top_unc, kld)


def report(r: KLDivergenceResult) -> list[str]:
    """The closing statistics blocks, as llama-perplexity prints them (none below 100 tokens)."""
    if r.count < 100:
        return []
    lines = ["====== Perplexity statistics ======",
             "Mean PPL(Q)                   : %10.6f ± %10.6f" % (r.ppl_q, r.ppl_q_unc),
             "Mean PPL(base)                : %10.6f ± %10.6f" % (r.ppl_base, r.ppl_base_unc),
             "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%" % (100 * r.ln_ppl_cor),
             "Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f" % (r.ln_ppl_ratio, r.ln_ppl_ratio_unc),
             "Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f" % (r.ppl_ratio, r.ppl_ratio_unc),
             "Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f" % (r.ppl_diff, r.ppl_diff_unc),
             "", "====== KL divergence statistics ======",
             "Mean    KLD: %10.6f ± %10.6f" % (r.kld_mean, r.kld_unc),
             "Maximum KLD: %10.6f" % r.kld_max]
    lines += ["%s KLD: %10.6f" % (label, r.kld_percentiles[f]) for label, f in KLD_HIGH]
    lines.append("Median  KLD: %10.6f" % r.kld_median)
    lines += ["%s KLD: %10.6f" % (label, r.kld_percentiles[f]) for label, f in KLD_LOW]
    lines += ["Minimum KLD: %10.6f" % r.kld_min, "", "====== Token probability statistics ======",
              "Mean    Δp: %6.3f ± %5.3f %%" % (100 * r.dp_mean, 100 * r.dp_unc),
              "Maximum Δp: %6.3f%%" % (100 * r.dp_max)]
    lines += ["%s Δp: %6.3f%%" % (label, 100 * r.dp_percentiles[f]) for label, f in DP_HIGH]
    lines.append("Median  Δp: %6.3f%%" % (100 * r.dp_median))
    lines += ["%s Δp: %6.3f%%" % (label, 100 * r.dp_percentiles[f]) for label, f in DP_LOW]
    lines += ["Minimum Δp: %6.3f%%" % (100 * r.dp_min),
              "RMS Δp    : %6.3f ± %5.3f %%" % (100 * r.rms_dp, 100 * r.rms_dp_unc),
              "Same top p: %6.3f ± %5.3f %%" % (100 * r.same_top, 100 * r.same_top_unc)]
    return lines
