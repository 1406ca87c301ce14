"""Chat templates (--chat, -sys): rendered as llama.cpp's --jinja / HF transformers do, in a sandbox.

SmolLM2's expected text below is written out by hand from its template (GGUF tokenizer.chat_template:
a default system turn when the first message is not a system one, then `<|im_start|>ROLE\\nCONTENT
<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`), and the tokens are checked against the
prompt llama-completion evaluates for the same messages (`-cnv -st --jinja -sys ... -p ...`)."""


import pytest
from typer.testing import CliRunner

from llamavk.chat_template import CHATML, TemplateError, chat_messages, render_chat

from .llamacpp_ref import llamacpp_prompt_tokens

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smollm2_file(smollm2_path):
    from llamavk.models import load_model_file
    return load_model_file(smollm2_path)


def smollm2_expected(user: str, system: str | None) -> str:
    return (f"<|im_start|>system\n{system if system is not None else SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_smollm2_template_renders_as_transformers(smollm2_file, system):
    template = smollm2_file.metadata["tokenizer.chat_template"]
    text = render_chat(template, chat_messages("What is 2+2?", system), bos_token="<|im_start|>",
                       eos_token="<|im_end|>")
    assert text == smollm2_expected("What is 2+2?", system)


def test_without_generation_prompt(smollm2_file):
    template = smollm2_file.metadata["tokenizer.chat_template"]
    text = render_chat(template, chat_messages("hi", "sys"), add_generation_prompt=False)
    assert text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def _llamacpp_chat_tokens(model, user: str, system: str | None) -> list[int]:
    return llamacpp_prompt_tokens(model, "-p", user, "--jinja", "-cnv", "-st",
                                  *(["-sys", system] if system is not None else []))


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_smollm2_chat_tokens_equal_llama_cpps(smollm2_path, smollm2_file, system):
    from llamavk.tokenizer import Tokenizer

    expected = _llamacpp_chat_tokens(smollm2_path, "What is 2+2?", system)
    tok = Tokenizer.from_metadata(smollm2_file.metadata)
    text = render_chat(smollm2_file.metadata["tokenizer.chat_template"], chat_messages("What is 2+2?", system))
    assert tok.encode(text) == expected
    assert expected[0] == 1 and len(expected) > 20           # <|im_start|>: the template was applied


# -- llama.cpp's semantics ---------------------------------------------------------------------------
BOS_TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"


def test_bos_and_eos_are_not_doubled():
    msgs = chat_messages("hi")
    assert render_chat(BOS_TEMPLATE, msgs, bos_token="<s>", eos_token="</s>") == "<s>[user] hi</s>"
    assert render_chat(BOS_TEMPLATE, msgs, bos_token="<s>", eos_token="</s>", strip_bos=True,
                       strip_eos=True) == "[user] hi"


def test_blocks_are_trimmed_as_transformers_does():
    template = "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render_chat(template, chat_messages("a", "s")) == "a\n"


def test_tojson_does_not_escape_html_and_loop_controls_work():
    template = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                "{{ m.content | tojson }}{% endfor %}")
    assert render_chat(template, chat_messages("<a & 'b'> é", "s")) == "\"<a & 'b'> é\""


def test_generation_tag_and_strftime_now():
    template = "{% generation %}{{ messages[0].content }}{% endgeneration %} {{ strftime_now('%Y') | length }}"
    assert render_chat(template, chat_messages("x")) == "x 4"


def test_template_errors_are_template_errors():
    with pytest.raises(TemplateError, match="refused the messages: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", chat_messages("x"))
    with pytest.raises(TemplateError, match="cannot render"):
        render_chat("{% for m in messages %}", chat_messages("x"))
    with pytest.raises(TemplateError, match="cannot render"):
        render_chat("{{ messages[5].content }}", chat_messages("x"))


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__['__builtins__'] }}",
    "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_sandbox_refuses_python_internals(template):
    with pytest.raises(TemplateError, match="sandbox refuses|cannot render"):
        render_chat(template, chat_messages("x"))


def test_chatml_fallback():
    assert render_chat(CHATML, chat_messages("hi", "s")) == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


# -- llamavk run --chat / -sys ------------------------------------------------------------------------
def cli(*args):
    from llamavk.cli import app
    return CliRunner().invoke(app, list(args))


def test_run_with_system_prompt_displays_and_evaluates_the_chat(smollm2_path):
    r = cli("run", "-m", str(smollm2_path), "-p", "What is 2+2?", "-sys", "You are terse.", "-n", "1",
            "--temp", "0", "-c", "128")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(smollm2_expected("What is 2+2?", "You are terse."))
    assert "/    26 tokens" in r.stderr            # llama-completion's prompt for these messages: 26 tokens


def _with_template(src, dst, template: str):
    """A copy of a GGUF whose chat template is replaced by one of the same length (padded with a Jinja
    comment), so every offset after it stays valid."""
    from llamavk.models import load_model_file

    old = load_model_file(src).metadata["tokenizer.chat_template"].encode()
    new = template.encode()
    pad = len(old) - len(new) - len("{##}")
    assert pad >= 0
    new = new + b"{#" + b" " * pad + b"#}"
    data = src.read_bytes()
    assert data.count(old) == 1
    dst.write_bytes(data.replace(old, new))
    return dst


@pytest.mark.parametrize("template,words", [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox refuses"),
    ("{{ raise_exception('no system role') }}", "refused the messages: no system role"),
])
def test_run_with_a_bad_template_is_a_one_line_error(smollm2_path, tmp_path, template, words):
    path = _with_template(smollm2_path, tmp_path / "evil.gguf", template)
    r = cli("run", "-m", str(path), "-p", "hi", "--chat", "-n", "1", "-c", "64")
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], r.stderr
