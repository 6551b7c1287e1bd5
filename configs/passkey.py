"""A model that retrieves from its whole context, trained from scratch on a CPU: passkey
retrieval learned at 256 tokens, then the context extended to 2,048 and 8,192 (RoPE by YaRN)
and a last cool stage at 8,192, the sequence sharded over 4 fake devices throughout (Ulysses);
about 35 minutes on 2 cores, from scratch (BENCHMARKS.md).

    make train-passkey
    # = python train.py --config configs/passkey.py --workdir runs/passkey
    python scripts/eval_long.py --workdir runs/passkey --seq_shards 4 --dynamic_rope \
        --samples 20 --json runs/passkey_probes.json   # 1,024 .. 16,384 x 10 depths x 20 keys

The default model's shape and corpus; what makes the copy learnable in minutes: digits are
single tokens (the tokenizer splits them), rows are cut into several examples of many lengths
(each its own document; data/passkey.py), the space and five digits of each answer weigh more
in the loss the fewer answers a row holds (8 at 256 tokens, 32 at 2,048, 128 at 8,192), the
longer stages' keys mostly repeat a digit in a row, and every query head has its own key/value
head. Every example's filler is the corpus's own text, which the model keeps learning
(eval/loss is on held-out text only). The keys the probes ask for are never stated in training
(data.passkey.held_out).

Past 8,192 tokens the model is read with --dynamic_rope: its YaRN factor stretched by the
prompt's length over 8,192 (training/extension.py), which keeps retrieval at twice the trained
length without more training. scripts/bench/extension.py compares the YaRN extension with the
other rules from the same stage-1 checkpoint. BENCHMARKS.md has the figures.
"""

from configs import default

SHORT, LONG = 256, 8192
# RoPE for the whole extended context from the first longer stage on: YaRN for 64x the first
# stage's length, so that 16,384 tokens (twice the longest trained) stay inside the rotations
# the model has seen; the later stages keep it and only add length. YaRN's ramp keeps the
# frequencies of the dimensions that turn at least beta_fast times over the first stage's 256
# tokens and slows those below beta_slow the whole 64x. Its usual beta_fast, 32, kept only the
# fastest of a head's 16 pairs and slowed the next six 1.2x to 6.4x: the short-range positions
# a previous-token head reads to copy the next digit. With 4, the five fastest keep theirs, and
# the probes missed 2 keys in 1,200 up to 8,192 tokens instead of 3 in 400 (BENCHMARKS.md).
EXTENDED = dict(rope_scaling=dict(rope_type="yarn", factor=64.0,
                                  original_max_position_embeddings=SHORT,
                                  beta_fast=4.0, beta_slow=1.0))
# The longer stages' keys: three in four repeat a digit in a row (30039), against a third drawn
# uniformly. At 256 tokens the first stage copies those as well as any other; at thousands of
# tokens the copy slipped on them (30039 -> 30313: after a 0, the digit that follows the other
# 0), so the longer stages drill them.
REPEATS = 0.75


def get_config():
    config = default.get_config()
    # A key and value head per query head: copying five digits, repeats among them, takes a
    # previous-token head and a matching head in the same layer pair, which two shared key/value
    # heads leave too little room for.
    config.model.num_kv_heads = 4
    # Ulysses: the sequence stays split over the 4 devices outside attention, and inside it an
    # all-to-all gives each device one head over the whole sequence. With 4 fake devices sharing
    # 2 cores, one head's whole causal attention per device costs less than a ring's 4 hops of
    # tiles: train.py's tokens/s rose about 10% at 256 tokens, 14% at 2,048 and 34% at 8,192
    # over the ring strategy here, with the same losses (14-step runs of each stage's settings).
    config.parallel.strategy = "ulysses"
    config.parallel.layout = "striped"  # the order the recipe was measured in
    config.parallel.tile = 32  # the tiles the recipe was measured with (the longer stages: larger)
    config.eval_position_buckets = 0
    config.data.eval_fraction = 0.005  # 57k held-out tokens: the probes' filler at 16,384
    config.data.passkey_fraction = 0.75  # rows made examples; the rest stay plain text
    # Loss weight of each answer's space and five digits. A longer row holds fewer answers (about
    # two at 8,192 tokens against some 64 in a batch of 256-token rows), so the longer stages weigh
    # each one more. With 8 at every length the answers were about 1% of the last stage's loss
    # (two answers' 6 tokens x 8 against 8,192 tokens of weight 1), and the probes' grid missed
    # 18 keys in 500; with these weights, these keys and 450 steps at 8,192 instead of 300, it
    # misses 3 (BENCHMARKS.md).
    config.data.passkey_weight = 8.0
    config.checkpoint_keep = 2
    config.stages = (
        # The copy, learned cheaply: every row two or three examples of 90 to 256 tokens.
        dict(name="256", steps=800, seq_len=SHORT, global_batch_size=32,
             data=dict(passkey_min_len=90, passkey_fraction=1.0),
             eval_every_steps=200, checkpoint_every_steps=200),
        # Longer distances, the extended RoPE: examples of 256 to 2,048 tokens.
        dict(name="2k", steps=150, seq_len=2048, global_batch_size=4,
             data=dict(passkey_min_len=256, passkey_repeats=REPEATS, passkey_weight=32.0),
             model=EXTENDED, parallel=dict(tile=128),
             optim=dict(learning_rate=1e-3, warmup_steps=10),
             eval_every_steps=75, checkpoint_every_steps=75),
        # The longest: examples of 1,024 to 8,192 tokens, 8,192 tokens a step.
        dict(name="8k", steps=450, seq_len=LONG, global_batch_size=1,
             data=dict(passkey_min_len=1024, passkey_repeats=REPEATS, passkey_weight=128.0),
             model=EXTENDED, parallel=dict(tile=256),
             optim=dict(learning_rate=1e-3, warmup_steps=10),
             eval_every_steps=100, checkpoint_every_steps=100),
        # A cool-down at the longest length: keys drawn uniformly, as the probes draw them, at a
        # third of the learning rate. What the probes still missed after the third stage were
        # single digits of uniform keys (84756 -> 84766), not the repeats drilled above; after
        # this stage they miss one key in 286 up to 8,192 tokens instead of one in 170 (5
        # minutes more; BENCHMARKS.md).
        dict(name="8k-uniform", steps=100, seq_len=LONG, global_batch_size=1,
             data=dict(passkey_min_len=1024, passkey_repeats=0.0, passkey_weight=128.0),
             model=EXTENDED, parallel=dict(tile=256),
             optim=dict(learning_rate=3e-4, warmup_steps=10),
             eval_every_steps=50, checkpoint_every_steps=50),
    )
    return config
