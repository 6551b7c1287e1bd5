"""The embedded default: a small Llama-style model learns Python from the standard library.

    make train
    # = python train.py --config configs/default.py --workdir runs/default

Runs anywhere: on a CPU it fakes 4 devices (data 1 x seq 4) and trains for under 10 minutes on
2 cores. Tokens per step: global_batch_size 8 x seq_len 1024 = 8,192; 200 steps see about 1.6M
tokens. The attention (layout, strategy, tile) and the memory switches are the planner's ('auto':
the fastest it predicts that fits; the run's first lines say what it chose); any of them given,
e.g. --config.parallel.layout=ring, is taken as given.

Every field, its type, default and meaning is declared once, in run_config/schema.py (the run,
parallel, mesh, data, optim, profile) and model/config.py with model/sections.py and
model/rope.py (the model); this file is those defaults as a ConfigDict, which every other config
file starts from and --config.FIELD=VALUE overrides.
"""

from run_config.config_dict import default_config


def get_config():
    return default_config()
