"""A small hybrid trained at a million tokens a sequence on one host: 4 fake CPU devices, the
sequence over all 4 (262,144 tokens each), three Gated DeltaNet layers to one sliding-window
softmax layer (Samba's and Gemma 3's local attention: full causal attention at 1,048,576 tokens
is about 10^15 FLOPs a layer a step, hours on two CPU cores; the recurrent layers carry
what lies beyond the window).

    python train.py --config configs/hybrid_1m.py --workdir /tmp/hybrid_1m

Memory: every switch set to what fits the host's 24 GB (the run's peak: 18.8 GB resident;
BENCHMARKS.md): remat keeping nothing, the blocks scanned a period of 4
at a time, the loss and the MLP in chunks, the recurrent layers in pieces of 8,192 tokens
(parallel/recurrent/pieces.py), their sequence split by passing states. The planner's analytic
figures under-count XLA:CPU's copies here (left 'auto', it picks lighter switches that do not
fit), so the config gives them.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.seq_len = 1 << 20
    config.global_batch_size = 1
    config.num_train_steps = 2
    config.eval_every_steps = 2  # once, at the end: one million-token forward
    config.eval_batches = 1
    config.eval_position_buckets = 0
    config.log_every_steps = 1
    config.checkpoint_every_steps = 2
    config.mesh.data, config.mesh.seq = 1, 4
    config.parallel.layout = "ring"  # contiguous blocks: the recurrent layers need no reorder
    config.parallel.strategy = "ring"
    config.parallel.kernel = "xla"
    config.parallel.linear_strategy = "state"
    m = config.model
    m.d_model, m.mlp_dim, m.num_heads, m.num_kv_heads = 64, 192, 2, 1
    m.head_dim = 32
    m.layer_types = ("linear_attention",) * 3 + ("sliding_attention",)
    m.sliding_window = 4096
    la = m.linear_attention
    la.num_key_heads, la.num_value_heads = 2, 2
    la.key_head_dim, la.value_head_dim = 32, 32
    la.conv_kernel, la.chunk_size = 4, 64
    m.remat, m.remat_policy, m.scan_layers = True, "nothing", True
    m.loss_chunk, m.mlp_chunk, m.linear_chunk = 4096, 8192, 8192
    return config
