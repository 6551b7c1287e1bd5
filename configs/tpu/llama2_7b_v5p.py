"""Llama-2 7B shapes on 64 TPU v5p chips at 32k tokens: the sequence over 16 chips, four
data-parallel groups, 64 sequences (2M tokens) a step.

    python scripts/plan.py --config configs/tpu/llama2_7b_v5p.py
    python scripts/calibrate.py --config llama2_7b_v5p     # MaxText's step times, predicted

The setting of MaxText's Ulysses measurements (llama2-7b, context parallelism 16 on 64 v5p
chips, 2M tokens per step; the step times: planner/calibration/step_times/llama2_7b_v5p.toml).
None of these points is in the TPU v5p calibration's fit (planner/devices.py): they check the
planner on a model, a mesh, a batch and a tuned recipe (block sizes of 1,024 and 2,048, 52% MFU) it was not fitted to. MaxText ran them
with every block rematerialised except the attention's output (its remat policy 'custom' with
the attention output kept on the device): here model.remat_policy 'attention', set for the
measured points by the table's setup (scripts/calibrate.py --config llama2_7b_v5p predicts all
three within 0.91-1.24). The config itself keeps remat_policy 'nothing', the least memory.

6.7B parameters: d_model 4096, 32 layers, 32 query and 32 KV heads x 128 (no GQA), SwiGLU 11008,
vocab 32000; bfloat16 compute, float32 parameters and AdamW state, every block rematerialised.
"""

from configs import accelerator_precision, accelerator_run, default

DEVICE = "tpu-v5p"  # scripts/plan.py's default --device for this file (not a config field)



def get_config():
    config = default.get_config()
    accelerator_run(config)
    config.seq_len = 32768  # tokens per sequence (2,048 per chip)
    config.global_batch_size = 64  # sequences per step: 2M tokens
    config.optim.grad_accum_steps = 1  # micro-batches per step
    config.mesh.data = 4  # data-parallel groups
    config.mesh.seq = 16  # sequence shards: 16 chips per sequence
    config.parallel.layout = "zigzag"  # layout: ring | striped | zigzag | balanced
    config.parallel.strategy = "ring"  # as measured (BENCHMARKS.md); 'auto': the planner's
    config.model.vocab_size = 32000  # Llama-2 tokenizer pieces = embedding rows
    config.model.d_model = 4096  # residual width
    config.model.num_layers = 32  # transformer blocks
    config.model.num_heads = 32  # query heads
    config.model.num_kv_heads = 32  # key/value heads (no GQA)
    config.model.head_dim = 128  # per-head width
    config.model.mlp_dim = 11008  # SwiGLU hidden width
    config.parallel.tile = "auto"  # the planner's (MaxText's measured blocks: the table's tiles)
    config.model.scan_layers = True  # one scanned layer: MaxText's default, and its memory
    accelerator_precision(config.model)
    return config
