"""A small hybrid trained at 1,048,576 tokens a sequence on this host's 4 fake devices (262,144
each): configs/hybrid_tiny.py's three Gated DeltaNet layers to one softmax layer, the softmax
layer sliding (a window of 2,048 keys: full causal attention over a million tokens is 2.8e14
FLOPs a layer forward, hours on 2 cores), a dense MLP in place of the experts.

    python train.py --config configs/hybrid_1m.py --workdir runs/hybrid_1m

The Gated DeltaNet layers' memory does not grow with the length: each device scans its block
and the devices pass one state per head (parallel.linear_strategy, 'auto' by the planner);
the run's first lines say what the planner resolved the memory switches to.
scripts/bench_hybrid.py memory compares the step's memory with softmax layers everywhere.
"""

from configs import hybrid_tiny


def get_config():
    config = hybrid_tiny.get_config()
    config.seq_len = 1 << 20  # tokens per sequence: 262,144 per device
    config.global_batch_size = 1
    config.num_train_steps = 2
    config.eval_every_steps = 2
    config.eval_batches = 1
    config.log_every_steps = 1
    config.data.eval_fraction = 0.1  # 1.15M of the standard library's 11.5M tokens: one row
    config.checkpoint_every_steps = 2
    m = config.model
    m.layer_types = ("linear_attention",) * 3 + ("sliding_attention",)
    m.sliding_window = 2048  # keys a query of the softmax layer sees
    m.moe.num_experts = 0  # a dense SwiGLU MLP a block
    return config
