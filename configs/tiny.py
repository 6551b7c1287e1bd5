"""Tiny: a few seconds per step on a laptop CPU, for tests and debugging.

    python train.py --config configs/tiny.py --workdir /tmp/ringstripe-tiny

Tokens per step: global_batch_size 4 x seq_len 128 = 512. Data: the first 2 MB of the Python
standard library's sources, a 512-piece BPE tokenizer trained on them.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.seq_len = 128  # tokens per sequence
    config.global_batch_size = 4  # sequences per step, all devices together
    config.num_train_steps = 20  # optimizer steps
    config.eval_every_steps = 10  # evaluate every this many steps (and at the end)
    config.eval_batches = 2  # batches in one evaluation
    config.eval_position_buckets = 0  # no loss-by-position curve (one compile less per run)
    config.log_every_steps = 2  # metrics every this many steps
    config.checkpoint_every_steps = 10  # asynchronous checkpoint every this many steps (and at the end)
    config.mesh.data = 2  # data-parallel shards
    config.mesh.seq = 2  # sequence shards: the attention ring's length

    config.model.vocab_size = 512  # tokenizer pieces = embedding rows (shared with data.vocab_size)
    config.model.d_model = 64  # residual width
    config.model.num_layers = 2  # transformer blocks
    config.model.num_heads = 4  # query heads
    config.model.num_kv_heads = 2  # key/value heads (GQA)
    config.model.head_dim = 16  # per-head width
    config.model.mlp_dim = 128  # SwiGLU hidden width
    config.parallel.tile = 0  # attention tiles; 0 = default (largest divisor of the block <= 512)

    config.data.max_bytes = 2_000_000  # tokenize only this many bytes of the source
    config.optim.learning_rate = 3e-3  # peak learning rate
    config.optim.warmup_steps = 5  # linear warmup steps
    return config
