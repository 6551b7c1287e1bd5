"""A model that retrieves from its whole context, trained from scratch on a CPU: passkey
retrieval learned at 256 tokens, then the context extended to 2,048 and 8,192 (RoPE by YaRN),
the sequence sharded over 4 fake devices throughout; about 40 minutes on 2 cores.

    make train-passkey
    # = python train.py --config configs/passkey.py --workdir runs/passkey
    python scripts/eval_long.py --workdir runs/passkey/stage3 --seq_shards 4 --dynamic_rope \
        --json runs/passkey_probes.json         # 1,024 .. 16,384 tokens x 10 depths x 10 keys

The default model's shape and corpus; what makes the copy learnable in minutes: digits are
single tokens (the tokenizer splits them), rows are cut into several examples of many lengths
(each its own document; data/passkey.py), the space and five digits of each answer weigh 8 in
the loss, and every query head has its own key/value head. Every example's filler is the
corpus's own text, which the model keeps learning (eval/loss is on held-out text only). The
keys the probes ask for are never stated in training (data.passkey.held_out).

Past 8,192 tokens the model is read with --dynamic_rope: its YaRN factor stretched by the
prompt's length over 8,192 (training/extension.py), which keeps retrieval at twice the trained
length without more training. scripts/bench_extension.py compares the YaRN extension with the
other rules from the same stage-1 checkpoint. BENCHMARKS.md has the figures.
"""

from configs import default

SHORT, LONG = 256, 8192
# RoPE for the whole extended context from the first longer stage on: YaRN for 64x the first
# stage's length, so that 16,384 tokens (twice the longest trained) stay inside the rotations
# the model has seen; the later stages keep it and only add length.
EXTENDED = dict(rope_scaling=dict(rope_type="yarn", factor=64.0,
                                  original_max_position_embeddings=SHORT))


def get_config():
    config = default.get_config()
    # A key and value head per query head: copying five digits, repeats among them, takes a
    # previous-token head and a matching head in the same layer pair, which two shared key/value
    # heads leave too little room for.
    config.model.num_kv_heads = 4
    config.eval_position_buckets = 0
    config.data.eval_fraction = 0.005  # 57k held-out tokens: the probes' filler at 16,384
    config.data.passkey_fraction = 0.75  # rows made examples; the rest stay plain text
    config.data.passkey_weight = 8.0  # loss weight of each answer's space and five digits
    config.checkpoint_keep = 2
    config.stages = (
        # The copy, learned cheaply: every row two or three examples of 90 to 256 tokens.
        dict(name="256", steps=800, seq_len=SHORT, global_batch_size=32,
             data=dict(passkey_min_len=90, passkey_fraction=1.0),
             eval_every_steps=200, checkpoint_every_steps=200),
        # Longer distances, the extended RoPE: examples of 256 to 2,048 tokens.
        dict(name="2k", steps=150, seq_len=2048, global_batch_size=4,
             data=dict(passkey_min_len=256), model=dict(EXTENDED, tile_q=128, tile_k=128),
             optim=dict(learning_rate=1e-3, warmup_steps=10),
             eval_every_steps=75, checkpoint_every_steps=75),
        # The longest: examples of 1,024 to 8,192 tokens, 8,192 tokens a step.
        dict(name="8k", steps=300, seq_len=LONG, global_batch_size=1,
             data=dict(passkey_min_len=1024), model=dict(EXTENDED, tile_q=256, tile_k=256),
             optim=dict(learning_rate=1e-3, warmup_steps=10),
             eval_every_steps=100, checkpoint_every_steps=100),
    )
    return config
