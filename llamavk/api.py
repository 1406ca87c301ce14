"""The public Python API (SPEC §8): everything the CLI does, callable from scripts.

    with llamavk.load("model.gguf") as m:
        ids = m.tokenize("The capital of France is")
        print(m.logits(ids)[-1].argmax())
        for tok in m.generate("Once upon a time", n=32, temp=0):
            ...
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from . import phases
from .chat_template import CHATML, render_chat
from .default_model import default_model_path
from .devices import open_devices, select
from .errors import LlamavkError, UsageError
from .llamacpp_compat import check_gpu_layers, kv_types_of
from .memory_fit import check_fit, estimate_device_need, free_memory, weight_progress
from .models import build_graph, load_model_file
from .runtime import DeviceRuntime
from .split import DEFAULT_MODE, SplitOptions, build_split_runtime, choose_devices
from .reverse_prompt import ReversePrompts
from .rope_options import apply_rope_options
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer
from .vk import get_instance


@dataclass
class Timings:
    """Milliseconds and counts of the last generate()/logits() call, as llama.cpp reports them."""
    load_ms: float = 0.0
    prompt_ms: float = 0.0
    prompt_tokens: int = 0
    eval_ms: float = 0.0
    eval_runs: int = 0
    sample_ms: float = 0.0


class Model:
    """A GGUF model loaded onto Vulkan devices. Use `llamavk.load(...)`."""

    def __init__(self, path: str | Path | None = None, *, devices: str | list[str] | None = None,
                 split_mode: str = DEFAULT_MODE, tensor_split: list[float] | None = None, main_gpu: int = 0,
                 max_gpu: int | None = None, reduce_type: str = "f16", n_ctx: int | None = None,
                 n_batch: int = 2048, n_ubatch: int = 512, n_gpu_layers: int | None = None,
                 verbose: bool = False, warn=None, progress=None, profile: bool = False, prepare_prompt=None,
                 type_k: str = "f16", type_v: str = "f16", prerecord: str = "generate", while_uploading=None,
                 kv_overrides=(), rope=None):
        """n_gpu_layers: llama.cpp's -ngl, accepted when it means every layer (None, -1 or at least
        the layer count): llamavk has no CPU offload. progress(done_bytes, total_bytes) is called as
        weights reach the devices. prepare_prompt(model) -> token ids, if given, is called during the
        load once the tokenizer is ready (the weights are still on their way): the steps that
        evaluating those tokens takes are recorded while the weights upload, so that the prompt's
        evaluation (generate(those tokens)) waits for the GPU only. Its result is
        `self.prepared_tokens`. type_k, type_v: the KV cache's types, llama.cpp's -ctk / -ctv
        (kv_cache.KV_CACHE_TYPES). prerecord: the steps recorded during the load (one device), "generate"
        (the one-token step, and the prepared prompt's batches) or "score" (perplexity's all-logits
        micro-batches; prepare_prompt's tokens are then only kept, e.g. the text tokenized while
        the weights upload). while_uploading(model), if given, is called when the load has nothing
        left to do but wait for the weights, if they are still on their way (one device): host work
        that can use that time (perplexity counts its whole text there). kv_overrides: (key, value)
        pairs replacing GGUF metadata values (llama.cpp's --override-kv; kv_override.py). rope: a
        rope_options.RopeOptions (llama.cpp's --rope-freq-base, --rope-scaling, --yarn-*, ...)."""
        t0 = time.perf_counter()
        warn = warn or (lambda msg: print(msg, file=sys.stderr))
        if n_batch < 1 or n_ubatch < 1:
            raise UsageError("batch sizes must be positive")
        n_ubatch = min(n_ubatch, n_batch)   # llama.cpp clamps the micro-batch to the batch
        self.kv_types = kv_types = kv_types_of(type_k, type_v)
        self.path = Path(path) if path else default_model_path()
        self.file = load_model_file(self.path, kv_overrides)
        if rope is not None:
            self.file.config = apply_rope_options(self.file.config, rope)
        phases.mark("GGUF parse")
        self.config = cfg = self.file.config
        check_gpu_layers(n_gpu_layers, cfg.n_layer)
        kv_types.check_head_dim(cfg.head_dim)
        self.tokenizer = Tokenizer.from_metadata(self.file.metadata)
        phases.mark("vocabulary")
        requested = ",".join(devices) if isinstance(devices, (list, tuple)) else devices
        instance = get_instance()
        phases.mark("Vulkan instance")
        entries, warnings = select(instance.devices, requested)
        for w in warnings:
            warn(w)
        opts = SplitOptions(split_mode, list(tensor_split) if tensor_split is not None else None, main_gpu,
                            max_gpu, reduce_type)
        chosen, shares = choose_devices(opts, entries)
        self.devices = open_devices([entries[i] for i in chosen])
        phases.mark("device")
        if n_ctx is None or n_ctx <= 0:
            n_ctx = cfg.n_ctx_train if n_ctx == 0 else min(cfg.n_ctx_train, 4096)
        if cfg.attn_temp_floor and n_ctx > cfg.attn_temp_floor:
            raise LlamavkError(f"{cfg.arch}: a context of {n_ctx} tokens needs the attention temperature "
                               f"scaling llamavk does not implement past position {cfg.attn_temp_floor}; "
                               f"use -c {cfg.attn_temp_floor} or less")
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.split_mode = opts.mode if len(chosen) > 1 else "none"
        self.prepared_tokens = None
        graphs = {"last": build_graph(cfg), "all": build_graph(cfg, all_logits=True)}
        try:
            if len(chosen) == 1:
                need = estimate_device_need(self.file, graphs, n_ctx, n_ubatch, self.devices[0], kv_types)
                check_fit([need], free_memory(self.devices), n_available=len(entries))
                phases.mark("graphs, fit check")
                # The weights stream to the device on a worker thread while this one records the
                # decode step (and the prompt's), creating the pipelines those need.
                # the kernels the last load of this file made here, made again on threads meanwhile
                from .vk import kernel_list
                kernels_key = kernel_list.model_key(self.path)
                self.runtime = rt = DeviceRuntime(self.file, self.devices[0], n_ctx, n_ubatch, graphs,
                                                  profile=profile, progress=weight_progress(progress, need.weights),
                                                  background_upload=True, kv_types=kv_types,
                                                  prefetch=kernel_list.read(self.devices[0].info, kernels_key))
                try:
                    n_prompt = self._prepare(prepare_prompt)
                    if prerecord == "score":
                        rt.prerecord_scoring()
                    else:
                        rt.prerecord(n_prompt if n_prompt <= n_ctx else 0)
                    phases.mark("recordings")
                    if while_uploading is not None and rt.uploading():
                        while_uploading(self)
                finally:
                    rt.wait_weights()
                phases.mark("weights in (upload wait)")
                self._kernels_key = kernels_key     # close() records the kernels this model used
            else:
                opts.main_gpu = chosen.index(main_gpu) if main_gpu in chosen else 0
                self.runtime = build_split_runtime(self.file, self.devices, shares, opts, graphs, n_ctx, n_ubatch,
                                                   profile=profile, progress=progress, kv_types=kv_types)
                self._prepare(prepare_prompt)
                self.runtime.prerecord()      # the decode step, recorded before anyone waits for a token
                phases.mark("recordings")
        except BaseException:
            self.close()
            raise
        self.n_past = 0
        self.verbose = verbose
        self.timings = Timings(load_ms=(time.perf_counter() - t0) * 1e3)

    def _prepare(self, prepare_prompt) -> int:
        """Call the load's prepare_prompt hook; the number of tokens it returned."""
        if prepare_prompt is None:
            return 0
        self.prepared_tokens = list(prepare_prompt(self))
        phases.mark("prompt tokenized")
        return len(self.prepared_tokens)

    # -- text ----------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Ids of a text, or of bytes as llama_tokenize takes them (not UTF-8: tokenizer/stray_bytes.py)."""
        if isinstance(text, (bytes, bytearray)):
            from .tokenizer.stray_bytes import from_bytes
            text = from_bytes(bytes(text))
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (GGUF tokenizer.chat_template, Jinja), None when it has none."""
        template = self.file.metadata.get("tokenizer.chat_template")
        return template if isinstance(template, str) and template.strip() else None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """`messages` ([{"role": ..., "content": ...}]) as text in the model's chat format, rendered as
        llama.cpp's --jinja does (llamavk/chat_template.py); ChatML when the model has no template."""
        tok = self.tokenizer

        def text(tid):
            return tok.token_to_piece(tid).decode("utf-8", "replace") if tid is not None else ""

        return render_chat(self.chat_template or CHATML, messages, bos_token=text(tok.bos_id),
                           eos_token=text(tok.eos_id), add_generation_prompt=add_generation_prompt,
                           strip_bos=tok.add_bos, strip_eos=tok.add_eos)

    # -- evaluation ----------------------------------------------------------------------------
    def _eval(self, tokens, n_past: int, all_logits: bool, short_ok: bool = True):
        """short_ok=False: a prompt always through its own step (bench's prompt tests measure it)."""
        return self.runtime.eval("all" if all_logits else "last", tokens, n_past, short_ok=short_ok)

    def logits(self, tokens, all: bool = False) -> np.ndarray:
        """Logits of a fresh context: the last token's row (vocab,), or one row per token."""
        tokens = self.check_tokens(tokens)
        t0 = time.perf_counter()
        out = self._eval(tokens, 0, all)
        self.n_past = len(tokens)
        self.timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        self.timings.prompt_tokens = len(tokens)
        return out

    def check_tokens(self, tokens) -> list[int]:
        """`tokens` as ints, or a UsageError where one is outside the vocabulary or they do not fit the
        loaded context."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise UsageError("no tokens to evaluate")
        bad = [t for t in tokens if not 0 <= t < self.config.n_vocab]
        if bad:
            raise UsageError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        if len(tokens) > self.n_ctx:
            raise UsageError(f"{len(tokens)} tokens do not fit the context of {self.n_ctx} (use a larger -c)")
        return tokens

    def generate(self, prompt: str | bytes | list[int], n: int = -1, *, ignore_eos: bool = False,
                 reverse_prompts=(), **sampling) -> Iterator[int]:
        """Yield generated token ids: until `n` tokens (-1: no limit), end of generation, a full
        context, or the token after which the text ends with one of `reverse_prompts` (llama.cpp's -r,
        reverse_prompt.py; a prompt that ends with one yields nothing). Sampling is llama.cpp's chain
        (llamavk.sampling; a seed gives its draws), configured by SamplingParams' fields as keywords
        (temp=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=-1, repeat_penalty, typical_p, top_n_sigma,
        xtc_*, mirostat*, dry_*, logit_bias=[(token, bias)...], grammar (GBNF text), samplers, ...); ignore_eos:
        end-of-generation tokens are never sampled (llama.cpp's --ignore-eos)."""
        tokens = self.tokenize(prompt) if isinstance(prompt, (str, bytes)) else list(prompt)
        tokens = self.check_tokens(tokens)
        params = SamplingParams(**sampling)
        for t, _ in params.logit_bias:
            if not 0 <= t < self.config.n_vocab:
                raise UsageError(f"logit bias: token id {t} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        vocab = self.tokenizer.vocab
        suppress = set(vocab.suppress_ids) | (vocab.eog_ids if ignore_eos else set())
        sampler = Sampler(params, history=tokens, n_ctx=self.n_ctx, suppress=suppress, tokenizer=self.tokenizer)
        stop = ReversePrompts(self.tokenizer, reverse_prompts)
        tm = self.timings
        tm.eval_ms = tm.sample_ms = tm.prompt_ms = 0.0
        tm.eval_runs = tm.prompt_tokens = 0
        if stop.seen(tokens):                     # llama-completion checks before the prompt's evaluation
            return
        t0 = time.perf_counter()
        logits = self._eval(tokens, 0, False)
        self.n_past = len(tokens)
        tm.prompt_ms, tm.prompt_tokens = (time.perf_counter() - t0) * 1e3, len(tokens)
        produced = 0
        rt = self.runtime
        while n < 0 or produced < n:
            ts = time.perf_counter()
            token = sampler.sample(logits)
            sampler.accept(token)
            tm.sample_ms += (time.perf_counter() - ts) * 1e3
            if self.tokenizer.is_eog(token):
                return
            produced += 1
            yield token
            if self.n_past >= self.n_ctx or (n >= 0 and produced >= n) or stop.seen((token,)):
                return
            te = time.perf_counter()
            rt.run_batch("last", [token], self.n_past)
            logits = rt.logits(1)[0]
            self.n_past += 1
            tm.eval_ms += (time.perf_counter() - te) * 1e3
            tm.eval_runs += 1

    def perplexity(self, text: str, n_ctx: int | None = None, chunks: int = -1, on_chunk=None, on_scored=None,
                   n_seq: int | None = None, kl_divergence_base=None):
        """llama-perplexity over `text` (see llamavk.perplexity): chunks of n_ctx tokens (default: the
        model's context), second half of each scored. Returns a PerplexityResult.
        kl_divergence_base: also save this run's token distributions to that file (llama.cpp's
        --kl-divergence-base format, see llamavk.kld), for `kl_divergence` with another model."""
        bos = self.tokenizer.bos_id if self.tokenizer.add_bos else None
        # as llama-perplexity tokenizes its -f text; with a number of chunks, as far as they need it
        if chunks is not None and chunks >= 0:
            tokens, _ = self.tokenizer.encode_prefix(text, max(chunks, 2) * (n_ctx or self.n_ctx), parse_special=False)
        else:
            tokens = self.tokenize(text, parse_special=False)
        return self.perplexity_tokens(tokens, n_ctx, chunks, bos, on_chunk, on_scored, n_seq=n_seq,
                                      kl_divergence_base=kl_divergence_base)

    def kl_divergence(self, base, chunks: int = -1, on_chunk=None, n_seq: int | None = None):
        """Compare this model with a KL-divergence base file (written by `perplexity(...,
        kl_divergence_base=...)` or by llama-perplexity): the base's chunks are evaluated again and
        each token's distribution compared. Returns a kld_stats.KLDivergenceResult (mean KLD,
        percentiles, Δp, same top token...). `on_chunk(i, stats)` after each chunk (a KLDStats:
        `stats.chunk_line(i + 1)` is llama-perplexity's line)."""
        from .kld import KLDBase
        from .kld_stats import KLDStats

        b = KLDBase(base)
        try:
            b.check_model(self.config.n_vocab)
            stats = KLDStats()
            n_chunks = b.n_chunks if chunks is None or chunks < 0 else min(chunks, b.n_chunks)
            bos = self.tokenizer.bos_id if self.tokenizer.add_bos else None
            self.perplexity_tokens(b.tokens, b.n_ctx, n_chunks, bos,
                                   on_chunk=(lambda i, ppl: on_chunk(i, stats)) if on_chunk else None,
                                   on_scored=lambda logits, targets: stats.add(logits, targets, b.read_rows(len(logits))),
                                   min_chunks=1, n_seq=n_seq)
        finally:
            b.close()
        return stats.result()

    def hellaswag(self, path, tasks: int = 400, emit=None, log=None):
        """HellaSwag score of a llama.cpp task file (6 lines per task), as llama-perplexity
        --hellaswag computes it: a tasks.TaskScore (accuracy = acc_norm in percent). `emit` gets
        the lines llama-perplexity prints, `log` its progress notes."""
        from .tasks import hellaswag, read_task_file
        return hellaswag.score(self, read_task_file(path), tasks, emit, log)

    def winogrande(self, path, tasks: int = 0, emit=None, log=None):
        """Winogrande score of a llama.cpp CSV (llama-perplexity --winogrande); tasks 0: all."""
        from .tasks import read_task_file, winogrande
        return winogrande.score(self, read_task_file(path), tasks, emit, log)

    def multiple_choice(self, path, tasks: int = 0, emit=None, log=None):
        """Multiple-choice score of a llama.cpp binary task file (llama-perplexity --multiple-choice)."""
        from .tasks import multiple_choice, read_task_file
        return multiple_choice.score(self, read_task_file(path, binary=True), tasks, emit, log)

    def _token_scorer(self):
        """Perplexity's token log-probabilities reduced on the device (token_scorer.py), created on
        first use; None where the logits are not in one device's buffer (split modes keep the host's
        log-softmax) or LLAMAVK_PPL_HOST=1 asks for the host's."""
        from .token_scorer import TokenScorer, device_scoring_enabled

        if not isinstance(self.runtime, DeviceRuntime) or not device_scoring_enabled():
            return None
        if getattr(self, "_scorer", None) is None:
            self._scorer = TokenScorer(self.runtime)
        return self._scorer

    def perplexity_n_seq(self, n_ctx: int) -> int:
        """Chunks of n_ctx tokens one batch can evaluate as parallel sequences: n_batch / n_ctx (as
        llama-perplexity), as far as the loaded context holds them."""
        return max(1, min(self.n_batch, self.n_ctx) // n_ctx)

    def perplexity_tokens(self, tokens, n_ctx: int | None = None, chunks: int = -1, bos_id: int | None = None,
                          on_chunk=None, on_scored=None, min_chunks: int = 2, n_seq: int | None = None,
                          kl_divergence_base=None):
        """As perplexity(), over tokens; `bos_id` replaces each chunk's first token (None: as is).
        `n_seq` chunks are evaluated at once as parallel sequences (default perplexity_n_seq(n_ctx)); the
        loaded context must hold n_seq * n_ctx tokens."""
        from .perplexity import chunk_plan, perplexity

        if kl_divergence_base is not None:
            from .kld import KLDBaseWriter

            n_chunks = chunk_plan(len(tokens), n_ctx or self.n_ctx, chunks, min_chunks)
            with KLDBaseWriter(kl_divergence_base, n_ctx or self.n_ctx, self.config.n_vocab, n_chunks,
                               list(tokens)) as writer:
                def scored(logits, targets):
                    writer.add(logits, targets)
                    if on_scored:
                        on_scored(logits, targets)

                return self.perplexity_tokens(tokens, n_ctx, n_chunks, bos_id, on_chunk, scored, min_chunks, n_seq)

        n_ctx = n_ctx or self.n_ctx
        if n_ctx > self.n_ctx:
            raise UsageError(f"perplexity context {n_ctx} exceeds the loaded context {self.n_ctx}")
        n_seq = self.perplexity_n_seq(n_ctx) if n_seq is None else n_seq
        if n_seq < 1 or n_seq * n_ctx > self.n_ctx:
            raise UsageError(f"{n_seq} sequences of {n_ctx} tokens do not fit the loaded context {self.n_ctx}")

        def eval_all(batch):   # whole chunks back to back: one sequence each
            return self.runtime.eval("all", batch, 0, seq_len=n_ctx if len(batch) > n_ctx else 0)

        scorer = self._token_scorer()
        t0 = time.perf_counter()
        result = perplexity(list(tokens), n_ctx, eval_all, bos_id, chunks, on_chunk, on_scored, min_chunks, n_seq,
                            score_batches=scorer.score if scorer is not None else None)
        self.timings.prompt_ms = (time.perf_counter() - t0) * 1e3
        self.timings.prompt_tokens = result.n_chunks * n_ctx
        return result

    # -- lifetime ------------------------------------------------------------------------------
    def close(self, release: bool = True) -> None:
        """Free everything on the devices. release=False, for a process about to end: wait for the
        devices and save their pipeline caches only, leaving the rest to the process's exit (the
        CLI, which ends with os._exit: freeing hundreds of buffers and pipelines one by one took
        0.15 s of a 7.2B run's wall time on an H100)."""
        rt = getattr(self, "runtime", None)
        if rt is not None and hasattr(rt, "wait_weights"):
            rt.wait_weights(raise_error=False)   # no copy may still run when the device goes
        if getattr(self, "_kernels_key", None) is not None and hasattr(rt, "kc") and self.devices:
            from .vk import kernel_list
            kernel_list.write(self.devices[0].info, self._kernels_key, rt.kc.entries())
            self._kernels_key = None
        if rt is not None and hasattr(rt, "shared") and release:
            rt.close()
        for d in getattr(self, "devices", []):
            d.close(release=release)
        self.devices = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(path: str | Path | None = None, **kwargs) -> Model:
    """Load a GGUF model (default: the bundled SmolLM2-135M) onto the chosen devices."""
    return Model(path, **kwargs)
