"""Kernels that wait in their shader for the dispatch before them (kernels/chain.py) read what the step
wrote through coherent bindings, in the shipped SPIR-V.

Why: a pipeline barrier is what drops an SM's non-coherent cache lines. With every stage of a
one-token step chained (NVIDIA's default edges under -sm graph), a step may hold no barrier at all,
and the arena reuses addresses: a plain read may return what that SM cached there earlier in the step.
That is how 2 H200s gave other greedy tokens under -sm graph than -sm none for a tiny qwen3 (the
exchange point read the residual through a plain binding), while llvmpipe (no such caches) could not
show it. Read straight from the SPIR-V words (tests/test_shaders_coopmat.py's reader)."""

import pytest

from tests.test_shaders_coopmat import SPV, build, instructions

OP_DECORATE, OP_MEMBER_DECORATE, OP_TYPE_POINTER, OP_VARIABLE = 71, 72, 32, 59
DEC_BINDING, DEC_COHERENT = 33, 23


def _bindings(name: str) -> tuple[set[int], set[int]]:
    """(every descriptor binding of kernel `name`, those with a coherent declaration among them)."""
    binding, coherent_ids, coherent_structs, pointee, var_type = {}, set(), set(), {}, {}
    for op, a in instructions((SPV / f"{name}.spv").read_bytes()):
        if op == OP_DECORATE and a[1] == DEC_BINDING:
            binding[a[0]] = a[2]
        elif op == OP_DECORATE and a[1] == DEC_COHERENT:
            coherent_ids.add(a[0])
        elif op == OP_MEMBER_DECORATE and a[2] == DEC_COHERENT:
            coherent_structs.add(a[0])
        elif op == OP_TYPE_POINTER:
            pointee[a[0]] = a[2]
        elif op == OP_VARIABLE:
            var_type[a[1]] = a[0]
    coherent = {b for var, b in binding.items()
                if var in coherent_ids or pointee.get(var_type.get(var)) in coherent_structs | coherent_ids}
    return set(binding.values()), coherent


def _rope_kv_qkv(name: str) -> set[int]:
    first = 2 if "freqs" in name else 1      # rope_kv.comp B0: after the step (and the frequencies)
    return {first, first + 1, first + 2}


# kernel name prefix -> the bindings a waiting variant reads after its wait that the step wrote
# (activations; never weights, which no step writes)
CHAINED = {
    "exchange_reduce": lambda n: {3, 4},              # the peers' partials, the residual (base)
    "mul_mv_stream_": lambda n: {1, 5, 6},            # x, the residual, the GLU's up
    "mul_mv_id_": lambda n: {1, 2, 5, 6},             # x, the route, the residual, the GLU's up
    "moe_router_": lambda n: {1},                     # x
    "attention_dec": lambda n: {0, 1, 2} if "wait" in n else set(),   # q, the K and V caches' new row
    "rope_kv": lambda n: _rope_kv_qkv(n) if "wait" in n else set(),   # the products' q, k, v
}
# (the benchmark-only stream variants NO_X / READ_ONLY, examples/bench_matvec.py, never run in a step)
KERNELS = sorted(n for n in build.VARIANTS for prefix in CHAINED
                 if n.startswith(prefix) and not n.startswith(("mul_mv_stream_dp_nox_", "mul_mv_stream_read_")))


def test_the_kernels_are_found():
    assert {"exchange_reduce", "exchange_reduce_clock", "mul_mv_stream_q4_0", "mul_mv_id_q4_k", "moe_router_f32",
            "attention_dec_wait_f16", "rope_kv_norm_wait_chain_f32", "attention_dec_split_wait_kvq",
            "rope_kv_wait_chain_kvq"} <= set(KERNELS)


@pytest.mark.parametrize("name", KERNELS)
def test_waiting_kernels_read_the_steps_activations_coherently(name):
    want = next(f(name) for prefix, f in CHAINED.items() if name.startswith(prefix))
    present, coherent = _bindings(name)
    assert want <= present, f"{name}: bindings {sorted(want - present)} not declared"
    assert want <= coherent, f"{name}: bindings {sorted(want - coherent)} read after the wait without coherent"
