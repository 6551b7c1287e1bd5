"""What a compiled train step of Gated DeltaNet layers moves over a ring of 4 (every
collective's bytes, XLA's own program): with state passing, independent of the length; with the
heads' all-to-alls, in proportion to it. Compiles 8 programs (about a minute): make test-slow."""

import jax
import pytest

import planner
import run_config
from configs import hybrid_tiny
from planner.run import make_run
from training.analysis.aot import compile_train_step

pytestmark = pytest.mark.heavy


def moved(layers: int, seq_len: int, strategy: str) -> dict:
    """{collective: bytes} of the compiled train step: `layers` Gated DeltaNet layers (4 key
    heads, 8 value heads of 32 x 32), one row of seq_len tokens, mesh 1 x 4, layout ring."""
    config = run_config.replace(run_config.build(hybrid_tiny.get_config()), {
        "seq_len": seq_len, "global_batch_size": 1, "parallel.layout": "ring",
        "parallel.strategy": "ring", "parallel.kernel": "xla", "parallel.tile": 512,
        "parallel.linear_strategy": strategy, "model.num_layers": layers,
        "model.layer_types": ("linear_attention",) * layers, "model.moe.num_experts": 0,
        "model.linear_attention.num_key_heads": 4, "model.linear_attention.num_value_heads": 8,
        "model.remat": False, "model.loss_chunk": 0, "model.mlp_chunk": 0})
    resolved = planner.resolve_run(config, (1, 4), "cpu", jax.devices()[0].device_kind)
    assert resolved.attention.linear_strategy == strategy
    figures, _ = compile_train_step(config, make_run(config, 4, (1, 4)), resolved)
    return figures["collective_bytes"]


def test_state_passing_moves_the_same_bytes_at_any_length_and_head_all_to_alls_grow():
    """Two more layers (3 against 1) add at most 1.25x as many bytes at 8,192 tokens as at
    2,048 with 'state' (the states' all-gathers, the halo; the weights' own gathers the same);
    the 'heads' all-to-alls grow with the length, 3.5x to 4.5x over the same 4x."""
    state, heads = {}, {}
    for seq_len in (2048, 8192):
        one, three = moved(1, seq_len, "state"), moved(3, seq_len, "state")
        state[seq_len] = sum(three.values()) - sum(one.values())
        one, three = moved(1, seq_len, "heads"), moved(3, seq_len, "heads")
        heads[seq_len] = three["all-to-all"] - one["all-to-all"]
    assert 0 < state[8192] <= 1.25 * state[2048], state
    assert 3.5 <= heads[8192] / heads[2048] <= 4.5, heads
