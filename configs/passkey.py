"""The default model taught to retrieve: a share of its training rows are passkey examples (a
5-digit key hidden in the row's own text, asked for at the end), so the retrieval probes have
something to find.

    python train.py --config configs/passkey.py --workdir runs/passkey
    python scripts/eval_long.py --workdir runs/passkey --lengths 512 1024 2048 4096 \
        --json runs/passkey_probes.json                                    # + the heatmap
    python scripts/plot_figures.py positions runs/passkey                  # the loss by position

Runs on a CPU (4 fake devices) in about a quarter of an hour on 2 cores. BENCHMARKS.md has the
heatmap at the trained length (1,024) and beyond it, and the loss-by-position curves.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.num_train_steps = 600  # optimizer steps (the default run's 200, three times)
    config.eval_every_steps = 100  # with each eval, the loss by position (8 ranges of 128)
    config.checkpoint_every_steps = 100
    config.data.passkey_fraction = 0.25  # a quarter of the rows are passkey examples
    config.data.eval_fraction = 0.03  # held-out text for the probes' filler, up to 4,096 tokens
    return config
