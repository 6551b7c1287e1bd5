"""Striped Attention paper, TPU setting, largest model: the LLaMA-7B shapes at 786,432 tokens on
16 TPU v4 chips (v4-32), the paper's largest model and longest sequence together.

    python scripts/plan.py --config configs/tpu/paper_tpuv4_786k_7b.py --compile tpu
    python scripts/tpu_pod.py all --name ringstripe-v4 --zone us-central2-b \\
        --accelerator-type v4-32 --config configs/tpu/paper_tpuv4_786k_7b.py \\
        --workdir gs://my-bucket/ringstripe/paper_tpuv4_786k_7b

Everything as configs/tpu/paper_tpuv4_786k.py (mesh data 1 x seq 16, striped, 49,152 tokens per
chip, chunked loss and MLP, scanned blocks) with the 6.7B shapes of configs/gpu/llama_7b.py. At
49,152 tokens per chip the 32 layers' block inputs that remat keeps are 12.9 GB per chip, more
than the rest of the step's largest terms together: with them in HBM the TPU compiler puts the
step at 40 GB of a v4 chip's 32. remat_policy 'offload' keeps them in the host's memory instead
(12.9 GB per chip, 52 GB of a v4 host's 4 chips) and copies each back for its block's backward.
"""

from configs import accelerator_precision
from configs.tpu import paper_tpuv4_786k
from model import presets

DEVICE = "tpu-v4"  # scripts/plan.py's default --device for this file (not a config field)


def get_config():
    config = paper_tpuv4_786k.get_config()
    config.model.update(presets.LLAMA_7B)  # model/presets.py
    accelerator_precision(config.model)
    config.model.remat_policy = "offload"  # block inputs in host memory (pinned_host)
    return config
