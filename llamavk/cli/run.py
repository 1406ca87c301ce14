"""`llamavk run`: one-shot completion, like `llama-completion -no-cnv`.

Prints the prompt, streams the completion to stdout, and the timing summary to stderr in
llama.cpp's shape. Ctrl-C stops generation cleanly and still prints the timings (exit 130).

llama.cpp's flags work as in llama-completion (llamavk/llamacpp_compat.py): escapes in -p/-f/-sys
are processed unless --no-escape; --ignore-eos never samples an end-of-generation token;
--no-display-prompt leaves the prompt out of stdout, --verbose-prompt lists its tokens on stderr;
the sampling flags are llama.cpp's chain (llamavk/sampling.py); -ngl/-fa/-ctk/-ctv are checked; -t,
--no-warmup, -no-cnv and --jinja are accepted. --chat (or -sys) renders the model's chat template
(llamavk/chat_template.py) with the prompt as one user turn, after a system turn with -sys: what
llama-completion's conversation mode evaluates for a single turn (`-cnv -st --jinja`); the rendered
text is what is displayed.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import typer

from ..chat_template import chat_messages
from ..errors import UsageError
from ..llamacpp_compat import check_common, no_effect_notes, process_escapes
from . import fast_exit
from .common import (DEVICE, MAIN_GPU, MAX_GPU, REDUCE_TYPE, SPLIT_MODE, TENSOR_SPLIT, VERBOSE, describe_model,
                     eprint, split_kwargs, user_errors)
from .llamacpp_flags import (CACHE_TYPE_K, CACHE_TYPE_V, FLASH_ATTN, GPU_LAYERS, MLOCK, NO_MMAP, NO_WARMUP, OVERRIDE_KV,
                             ROPE_FREQ_BASE, ROPE_FREQ_SCALE, ROPE_SCALE, ROPE_SCALING, THREADS, YARN_ATTN_FACTOR,
                             YARN_BETA_FAST, YARN_BETA_SLOW, YARN_EXT_FACTOR, YARN_ORIG_CTX, kv_overrides, rope)
from .load_progress import LoadProgress

PERF = "llamavk_perf"


def prompt_token_lines(tokenizer, prompt: str, tokens: list[int]) -> list[str]:
    """llama-completion's --verbose-prompt lines: the prompt, its token count, each id and piece."""
    lines = [f"prompt: '{prompt}'", f"number of tokens in prompt = {len(tokens)}"]
    lines += [f"{t:6d} -> '{tokenizer.token_to_piece(t).decode('utf-8', 'replace')}'" for t in tokens]
    return lines


def write_text(out, text: str) -> None:
    """Text to stdout; stray bytes (a prompt that is not UTF-8: tokenizer/stray_bytes.py) as the bytes
    they were, which a strict text stream would refuse."""
    from ..tokenizer.stray_bytes import has_stray_bytes, to_bytes

    if not has_stray_bytes(text):
        out.write(text)
    elif hasattr(out, "buffer"):
        out.flush()
        out.buffer.write(to_bytes(text))
    else:                                        # a text stream alone: the stray bytes as "?"
        out.write(text.encode("utf-8", "replace").decode("utf-8"))


def perf_report(t, total_ms: float) -> list[str]:
    def rate(ms, n):
        return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)
    p_per, p_tps = rate(t.prompt_ms, t.prompt_tokens)
    e_per, e_tps = rate(t.eval_ms, t.eval_runs)
    return [
        f"{PERF}:        load time = {t.load_ms:10.2f} ms",
        f"{PERF}: prompt eval time = {t.prompt_ms:10.2f} ms / {t.prompt_tokens:5d} tokens "
        f"({p_per:8.2f} ms per token, {p_tps:8.2f} tokens per second)",
        f"{PERF}:        eval time = {t.eval_ms:10.2f} ms / {t.eval_runs:5d} runs   "
        f"({e_per:8.2f} ms per token, {e_tps:8.2f} tokens per second)",
        f"{PERF}:    sampling time = {t.sample_ms:10.2f} ms",
        f"{PERF}:       total time = {total_ms:10.2f} ms / {t.prompt_tokens + t.eval_runs:5d} tokens",
    ]


def dry_breakers(values: list[str] | None, escape: bool) -> tuple[str, ...]:
    """--dry-sequence-breaker as llama.cpp reads it: the first one given replaces the defaults,
    "none" drops every one before it, escapes processed (with -e) after that."""
    from ..sampling_dry import DEFAULT_BREAKERS

    if not values:
        return DEFAULT_BREAKERS
    out: list[str] = []
    for v in values:
        out = [] if v == "none" else out + [v]
    return tuple(process_escapes(v) if escape else v for v in out)


def grammar_text(grammar: str | None, grammar_file: Path | None) -> str | None:
    """--grammar or --grammar-file's text (not both)."""
    if grammar is not None and grammar_file is not None:
        raise UsageError("give either --grammar or --grammar-file, not both")
    if grammar_file is None:
        return grammar
    try:
        return grammar_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise UsageError(f"cannot read grammar file {grammar_file}: {why}")


def parse_logit_bias(value: str) -> tuple[int, float]:
    """--logit-bias TOKEN_ID(+/-)BIAS as llama.cpp reads it: an integer, a sign, a number ("inf" too)."""
    m = re.fullmatch(r"\s*([+-]?\d+)\s*([+-])\s*(\S+)\s*", value)
    try:
        if m is None:
            raise ValueError
        return int(m.group(1)), float(m.group(3)) * (-1.0 if m.group(2) == "-" else 1.0)
    except ValueError:
        raise UsageError(f"--logit-bias {value!r}: expected TOKEN_ID(+/-)BIAS, as 15043+1 or 15043-inf") from None


def run(
    model: Path = typer.Option(None, "--model", "-m", help="GGUF model file (default: the bundled SmolLM2-135M)."),
    prompt: str = typer.Option(None, "--prompt", "-p", help="Prompt text."),
    file: Path = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
    n_predict: int = typer.Option(-1, "--n-predict", "-n", help="Tokens to generate (-1: until end of text or full context)."),
    ctx_size: int = typer.Option(None, "--ctx-size", "-c", help="Context size (default min(training context, 4096); 0: the model's)."),
    batch_size: int = typer.Option(2048, "--batch-size", "-b", help="Logical batch size."),
    ubatch_size: int = typer.Option(512, "--ubatch-size", "-ub", help="Micro-batch size for prompt processing."),
    seed: int = typer.Option(-1, "--seed", "-s", help="Sampling seed (-1: random); a seed draws as llama.cpp's."),
    temp: float = typer.Option(0.8, "--temp", help="Temperature (0: greedy)."),
    top_k: int = typer.Option(40, "--top-k", help="Top-k sampling (0: off)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Top-p sampling (1.0: off)."),
    min_p: float = typer.Option(0.05, "--min-p", help="Min-p sampling (0.0: off)."),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="Penalty for repeated tokens (1.0: off)."),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n",
                                      help="Tokens the penalties look back on (0: off, -1: the context)."),
    presence_penalty: float = typer.Option(0.0, "--presence-penalty",
                                           help="Subtracted once from a recent token's logit (0.0: off)."),
    frequency_penalty: float = typer.Option(0.0, "--frequency-penalty",
                                            help="Subtracted per occurrence of a recent token (0.0: off)."),
    typical_p: float = typer.Option(1.0, "--typical", "--typical-p",
                                    help="Locally typical sampling, parameter p (1.0: off)."),
    top_n_sigma: float = typer.Option(-1.0, "--top-nsigma", "--top-n-sigma", help="Top-n-sigma sampling (-1.0: off)."),
    xtc_probability: float = typer.Option(0.0, "--xtc-probability",
                                          help="XTC: chance of dropping the top choices (0.0: off)."),
    xtc_threshold: float = typer.Option(0.1, "--xtc-threshold",
                                        help="XTC: the top choices' least probability (> 0.5: off)."),
    mirostat: int = typer.Option(0, "--mirostat",
                                 help="Mirostat sampling instead of the chain: 1, or 2 (Mirostat 2.0); 0: off."),
    mirostat_eta: float = typer.Option(0.1, "--mirostat-lr", help="Mirostat's learning rate (eta)."),
    mirostat_tau: float = typer.Option(5.0, "--mirostat-ent", help="Mirostat's target entropy (tau)."),
    dry_multiplier: float = typer.Option(0.0, "--dry-multiplier", help="DRY repetition penalty's multiplier (0.0: off)."),
    dry_base: float = typer.Option(1.75, "--dry-base", help="DRY's base (below 1: ignored, as llama.cpp)."),
    dry_allowed_length: int = typer.Option(2, "--dry-allowed-length",
                                           help="DRY: repeats longer than this are penalized."),
    dry_penalty_last_n: int = typer.Option(64, "--dry-penalty-last-n",
                                           help="DRY: tokens looked back on for repeats (0: off)."),
    dry_sequence_breaker: list[str] = typer.Option(
        None, "--dry-sequence-breaker",
        help="A DRY sequence breaker, repeatable; replaces the defaults ('\\n', ':', '\"', '*'); 'none': none."),
    logit_bias: list[str] = typer.Option(None, "--logit-bias", "-l",
                                         help="TOKEN_ID(+/-)BIAS added to that token's logit, repeatable "
                                              "(15043+1, 15043-inf)."),
    grammar: str = typer.Option(None, "--grammar", help="A GBNF grammar the completion must follow (start rule root)."),
    grammar_file: Path = typer.Option(None, "--grammar-file", help="Read the GBNF grammar from a file."),
    reverse_prompt: list[str] = typer.Option(None, "--reverse-prompt", "-r",
                                             help="Stop once the text ends with this, repeatable "
                                                  "(as llama-completion)."),
    samplers: str = typer.Option(None, "--samplers",
                                 help="The samplers' order, separated by ';' (default penalties;dry;top_n_sigma;"
                                      "top_k;typ_p;top_p;min_p;xtc;temperature)."),
    sampling_seq: str = typer.Option(None, "--sampling-seq", "--sampler-seq",
                                     help="The samplers' order as letters (default edskypmxt)."),
    device: str = DEVICE,
    split_mode: str = SPLIT_MODE,
    tensor_split: str = TENSOR_SPLIT,
    main_gpu: int = MAIN_GPU,
    max_gpu: int = MAX_GPU,
    reduce_type: str = REDUCE_TYPE,
    chat: bool = typer.Option(False, "--chat", help="Apply the model's chat template: the prompt is one user turn."),
    system_prompt: str = typer.Option(None, "--system-prompt", "-sys", help="A system turn before the prompt (implies --chat)."),
    escape: bool = typer.Option(True, "--escape/--no-escape", "-e", help="Process escapes (\\n, \\t, \\xHH, ...) in the prompt, as llama.cpp does."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Never sample an end-of-generation token."),
    display_prompt: bool = typer.Option(True, "--display-prompt/--no-display-prompt", help="Print the prompt before the completion."),
    special: bool = typer.Option(False, "--special", "-sp",
                                 help="Print control tokens as their text (else as nothing, as llama-completion)."),
    verbose_prompt: bool = typer.Option(False, "--verbose-prompt",
                                        help="Print the prompt's tokens to stderr before generating."),
    gpu_layers: str = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    threads: int = THREADS,
    no_warmup: bool = NO_WARMUP,
    mlock: bool = MLOCK,
    no_mmap: bool = NO_MMAP,
    override_kv: list[str] = OVERRIDE_KV,
    rope_freq_base: float = ROPE_FREQ_BASE,
    rope_freq_scale: float = ROPE_FREQ_SCALE,
    rope_scale: float = ROPE_SCALE,
    rope_scaling: str = ROPE_SCALING,
    yarn_orig_ctx: int = YARN_ORIG_CTX,
    yarn_ext_factor: float = YARN_EXT_FACTOR,
    yarn_beta_fast: float = YARN_BETA_FAST,
    yarn_beta_slow: float = YARN_BETA_SLOW,
    yarn_attn_factor: float = YARN_ATTN_FACTOR,
    no_conversation: bool = typer.Option(False, "-no-cnv", "--no-conversation", help="Accepted: run is always one-shot."),
    jinja: bool = typer.Option(False, "--jinja", help="Accepted: --chat always renders the template with jinja2."),
    verbose: bool = VERBOSE,
) -> None:
    """Generate a completion of a prompt."""
    from .. import phases
    from ..api import load

    phases.mark("imports, arguments")

    with user_errors(verbose):
        n_gpu_layers = check_common(gpu_layers, flash_attn, cache_type_k, cache_type_v)
        overrides = kv_overrides(override_kv)
        rope_opts = rope(rope_freq_base, rope_freq_scale, rope_scale, rope_scaling, yarn_orig_ctx, yarn_ext_factor,
                         yarn_beta_fast, yarn_beta_slow, yarn_attn_factor)
        if prompt is not None and file is not None:
            raise UsageError("give either -p or -f, not both")
        if ctx_size is not None and ctx_size < 0:
            raise UsageError("-c must be 0 (the model's training context) or more")
        from ..sampling import CHAIN, SamplingParams, sampler_chain, sampler_sequence   # checked before the load

        if samplers is not None and sampling_seq is not None:
            raise UsageError("give either --samplers or --sampling-seq, not both")
        order = sampler_chain(samplers) if samplers is not None else \
            sampler_sequence(sampling_seq) if sampling_seq is not None else CHAIN

        sampling = dict(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                        repeat_last_n=repeat_last_n, seed=seed, presence_penalty=presence_penalty,
                        frequency_penalty=frequency_penalty, typical_p=typical_p, top_n_sigma=top_n_sigma,
                        xtc_probability=xtc_probability, xtc_threshold=xtc_threshold, mirostat=mirostat,
                        mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, samplers=order,
                        dry_multiplier=dry_multiplier, dry_allowed_length=dry_allowed_length,
                        dry_penalty_last_n=dry_penalty_last_n,
                        dry_sequence_breakers=dry_breakers(dry_sequence_breaker, escape),
                        logit_bias=[parse_logit_bias(v) for v in logit_bias or ()],
                        grammar=grammar_text(grammar, grammar_file))
        if dry_base >= 1.0:                   # llama.cpp's --dry-base keeps its default below 1
            sampling["dry_base"] = dry_base
        else:
            eprint(f"warning: --dry-base {dry_base} is below 1: ignored (1.75), as llama.cpp does")
        SamplingParams(**sampling)
        if file is not None:
            from ..perplexity import read_text   # as llama-completion's -f: raw bytes, one final LF dropped

            try:
                prompt = read_text(file)
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read prompt file {file}: {exc.strerror if isinstance(exc, OSError) else exc}")
        prompt = prompt or ""
        if escape:
            prompt = process_escapes(prompt)
            system_prompt = process_escapes(system_prompt) if system_prompt is not None else None
        if verbose:
            for note in no_effect_notes(threads, no_warmup, no_conversation, jinja, mlock, no_mmap):
                eprint(note)
        t_start = time.perf_counter()
        text = {"prompt": prompt}

        def prompt_tokens(m) -> list[int]:
            """The prompt as the model reads it; called during the load (its steps are recorded
            while the weights upload)."""
            if chat or system_prompt is not None:
                if m.chat_template is None:
                    eprint("warning: the model has no chat template (tokenizer.chat_template); using ChatML")
                text["prompt"] = m.apply_chat_template(chat_messages(prompt, system_prompt))
            tokens = m.tokenize(text["prompt"])
            if not tokens:
                raise UsageError("the prompt is empty and the model adds no BOS token: nothing to continue")
            return m.check_tokens(tokens)   # before the prompt is printed: an error stands on its own line

        with LoadProgress(model.name if model else "default model") as progress:
            m = load(model, devices=device, n_ctx=ctx_size, n_batch=batch_size,
                     n_ubatch=ubatch_size, n_gpu_layers=n_gpu_layers, verbose=verbose, warn=eprint,
                     progress=progress, prepare_prompt=prompt_tokens, type_k=cache_type_k, type_v=cache_type_v,
                     kv_overrides=overrides, rope=rope_opts,
                     **split_kwargs(split_mode, tensor_split, main_gpu, max_gpu, reduce_type))
        try:
            if verbose:
                for line in describe_model(m):
                    eprint(line)
            prompt, tokens = text["prompt"], m.prepared_tokens
            if verbose_prompt:
                for line in prompt_token_lines(m.tokenizer, prompt, tokens):
                    eprint(line)
            out = sys.stdout
            if display_prompt:
                write_text(out, prompt)
                out.flush()
            # the tokens' bytes as they come, as llama-completion prints them (a character split over
            # two tokens, or bytes that are not UTF-8, reach the terminal or file unchanged); a text
            # stream without bytes underneath (a test's) gets the decoded text
            raw = getattr(out, "buffer", None)
            stream = m.tokenizer.stream(special) if raw is None else None
            interrupted = False
            first = True
            try:
                stops = [process_escapes(r) if escape else r for r in reverse_prompt or ()]
                for token in m.generate(tokens, n=n_predict, ignore_eos=ignore_eos, reverse_prompts=stops, **sampling):
                    if raw is not None:
                        raw.write(m.tokenizer.token_to_piece(token, special))
                        raw.flush()
                    else:
                        out.write(stream.feed(token))
                        out.flush()
                    if first:
                        phases.mark("prompt, first token")
                        first = False
            except KeyboardInterrupt:
                interrupted = True
            out.write(("" if raw is not None else stream.flush()) + "\n")
            out.flush()
            phases.mark("generation")
            for line in perf_report(m.timings, (time.perf_counter() - t_start) * 1e3):
                eprint(line)
        finally:
            m.close(release=not fast_exit())
        phases.mark("teardown")
        if verbose or phases.requested():
            for line in phases.report():
                eprint(line)
        if interrupted:
            raise typer.Exit(130)
