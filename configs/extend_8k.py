"""Context extension in two stages: the default model learns at 1,024 tokens, then continues
at 8,192 with a RoPE base ten times larger, in one command (config.stages, training/stages.py).

    python train.py --config configs/extend_8k.py --workdir runs/extend_8k
    python train.py --config configs/extend_8k.py --workdir /tmp/try \
        --config.num_train_steps=20 --config.stages.2.seq_len=2048   # short stages: a quick try
    python scripts/eval_positions.py --workdir runs/extend_8k/stage1 \
        --workdir runs/extend_8k/stage2 --seq_len 8192      # the loss by position, before/after

Runs on a CPU (4 fake devices, data 1 x seq 4) in about 15 minutes on 2 cores: stage 1 is the
default run (200 steps of 8 x 1,024 tokens); stage 2 is 100 steps of 1 x 8,192 tokens (the same
tokens per step) from stage 1's weights with a fresh optimizer. A stopped run resumes inside the
stage it was in. BENCHMARKS.md has the loss at each position before and after.
"""

from configs import default


def get_config():
    config = default.get_config()
    # A larger held-out tail, so that evaluation finds documents longer than 8,192 tokens.
    config.data.eval_fraction = 0.03
    config.stages = (
        dict(name="1k", steps=200),  # the default run as it is
        dict(name="8k", steps=100,
             seq_len=8192,  # tokens per sequence: 8x
             global_batch_size=1,  # the same 8,192 tokens per step
             # Adjusted base frequency: positions 8x further apart rotate no faster than the
             # first stage's did at 1,024 (the base grows faster than the length, as in
             # Code Llama's and LWM's recipes).
             model=dict(rope_theta=100_000.0),
             parallel=dict(tile=256),  # blocks of 2,048 tokens per device
             optim=dict(learning_rate=1e-3, warmup_steps=10),
             eval_every_steps=50, checkpoint_every_steps=50),
    )
    return config
