"""A model's chat template (GGUF `tokenizer.chat_template`, Jinja) rendered as llama.cpp's `--jinja`.

The template comes from the model file and is untrusted input: it runs in jinja2's
ImmutableSandboxedEnvironment, which refuses attribute access to Python internals (`__class__`,
`__globals__`, ...) and calls of unsafe methods, and cannot mutate the values it is given; any such
attempt stops the rendering with an error (jinja2 alone would render some of them as ""). What it
sees is what HF transformers' `apply_chat_template` and llama.cpp's `--jinja` give it:

- `messages` (a list of {"role", "content"}), `add_generation_prompt`, `bos_token`, `eos_token`,
  `tools` (none), and llama.cpp's `enable_thinking` (true);
- `raise_exception(msg)` (the template's own error, reported as one line) and `strftime_now(fmt)`;
- blocks trimmed as transformers does (trim_blocks, lstrip_blocks), the loop-control extension,
  `tojson` without HTML escaping (json.dumps), and the `{% generation %}` tag (renders its body).

As llama.cpp, a leading BOS text is removed from the result when the tokenizer adds BOS itself, and a
trailing EOS text when it adds EOS, so that the tokens are not doubled. A model without a template
gets ChatML, llama.cpp's fallback.
"""

from __future__ import annotations

from datetime import datetime

from .errors import LlamavkError

# llama.cpp's fallback when a model has no chat template (written out here, not copied).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TemplateError(LlamavkError):
    """The chat template cannot be rendered: bad syntax, refused by the sandbox, or its own error."""


def _raise_exception(message):
    raise TemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(str(fmt))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML).
    import json     # here: only a template that calls tojson needs it (start-up time)

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment():
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it for
        training masks): renders its body unchanged."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    class Sandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj, attribute):
            # jinja2 hands back an undefined value that fails only when used further (printed bare
            # it is ""); refuse at the first attempt instead, so a probing template is reported.
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} is unsafe")

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def render_chat(template: str, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, strip_bos: bool = False, strip_eos: bool = False) -> str:
    """The text of `messages` in the template's format. strip_bos / strip_eos: remove a leading BOS /
    trailing EOS text (the tokenizer adds that token itself). Any failure is a TemplateError."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    try:
        compiled = _environment().from_string(template)
        text = compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, tools=None, enable_thinking=True)
    except TemplateError:
        raise
    except SecurityError as exc:
        raise TemplateError(f"the chat template tried something the sandbox refuses ({_one_line(exc)})") from None
    except JinjaError as exc:
        raise TemplateError(f"cannot render the chat template: {_one_line(exc)}") from None
    except RecursionError:
        raise TemplateError("cannot render the chat template: it recurses too deeply") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as exc:
        raise TemplateError(f"cannot render the chat template: {type(exc).__name__}: {_one_line(exc)}") from None
    if strip_bos and bos_token and text.startswith(bos_token):
        text = text[len(bos_token):]
    if strip_eos and eos_token and text.endswith(eos_token):
        text = text[:-len(eos_token)]
    return text


def chat_messages(prompt: str, system: str | None = None) -> list[dict]:
    """`llamavk run --chat`: an optional system turn (-sys), then the prompt as one user turn."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    return messages + [{"role": "user", "content": prompt}]


def _one_line(exc) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
