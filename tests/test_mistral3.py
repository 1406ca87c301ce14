"""mistral3 (Ministral 3): what differs from llama, checked by hand here; its logits against llama.cpp
are tests/test_llamacpp_oracle.py's mistral3 cases."""

import math
import subprocess
import sys

import pytest

from llamavk.errors import LlamavkError
from llamavk.models import config_from_metadata
from llamavk.synthetic import synthetic_plan

YARN = dict(rope_scaling="yarn", rope_factor=16.0, rope_orig_ctx=256, yarn_log_mul=1.0, attn_temp_scale=0.1)


def meta(**overrides):
    return {"general.architecture": "mistral3", **synthetic_plan("tiny", "f16", "mistral3", **overrides).metadata}


def test_yarn_log_multiplier_and_temperature_floor():
    cfg = config_from_metadata(meta(**YARN))
    # llama.cpp: cos / sin times attn_factor * (1 + 0.1 ln f), attn_factor = 1 / (1 + 0.1 m ln f): 1 for m = 1
    assert cfg.rope_scaling.attn_factor * (1 + 0.1 * math.log(16.0)) == pytest.approx(1.0)
    assert cfg.attn_temp_floor == 256
    plain = config_from_metadata(meta(**dict(YARN, yarn_log_mul=0.0, attn_temp_scale=0.0)))
    assert plain.rope_scaling.attn_factor == 1.0 and plain.attn_temp_floor == 0
    # without the original context in the file, the floor is the training context (llama.cpp's n_ctx_orig_yarn)
    assert config_from_metadata(meta(attn_temp_scale=0.1)).attn_temp_floor == 512


def test_experts_refused():
    m = dict(meta(), **{"mistral3.expert_count": 8, "mistral3.expert_used_count": 2})
    with pytest.raises(LlamavkError, match="mixture of experts is not supported"):
        config_from_metadata(m)


def test_context_past_the_temperature_floor_is_refused(synthetic_model):
    """A context the attention temperature would scale (positions >= the original context) ends with
    a one-line error; up to it, the model runs."""
    path = synthetic_model("mistral3", "q8_0", **YARN)
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(path), "-p", "hi", "-n", "2", "-c", "512"],
                       capture_output=True, text=True, errors="replace", timeout=600)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "use -c 256 or less" in errors[0] and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(path), "-p", "hi", "-n", "2", "-c", "256",
                        "--temp", "0"], capture_output=True, text=True, errors="replace", timeout=600)
    assert r.returncode == 0, r.stderr
