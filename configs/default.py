"""The embedded default: a small Llama-style model learns Python from the standard library.

    make train
    # = python train.py --config configs/default.py --workdir runs/default

Runs anywhere: on a CPU it fakes 4 devices (data 1 x seq 4) and trains for under 10 minutes on
2 cores. Tokens per step: global_batch_size 8 x seq_len 1024 = 8,192; 200 steps see about 1.6M
tokens. The attention (layout, strategy, tile) and the memory switches are the planner's ('auto':
the fastest it predicts that fits; the run's first lines say what it chose); any of them given,
e.g. --config.parallel.layout=ring, is taken as given.
"""

import ml_collections
from ml_collections import config_dict


def get_config():
    config = ml_collections.ConfigDict()
    config.seed = 0  # model init and data order
    config.seq_len = 1024  # tokens per sequence
    config.global_batch_size = 8  # sequences per step, all devices together
    config.num_train_steps = 200  # optimizer steps
    config.eval_every_steps = 50  # evaluate every this many steps (and at the end)
    config.eval_batches = 4  # batches in one evaluation
    # With each eval, the loss at this many equal ranges of original positions, on held-out
    # documents longer than seq_len read alone (eval/loss_by_position; 0 = off)
    config.eval_position_buckets = 8
    config.log_every_steps = 10  # metrics every this many steps
    config.checkpoint_every_steps = 50  # asynchronous checkpoint every this many steps (and at the end)
    config.checkpoint_keep = 3  # keep the latest this many checkpoints
    config.stop_at_step = 0  # save and exit 0 after this step, as on preemption (0 = never)
    # A resume refuses a checkpoint whose run was defined otherwise (tokenizer, data, seq_len,
    # global_batch_size, seed, eval_fraction); name here, comma-separated, what you change on
    # purpose, e.g. 'seq_len' to continue the weights at a new length.
    config.resume_accepts = ""
    # Where the first weights come from (a start only; a resume restores the run's own):
    # '' = random from seed; 'hf:PATH' = a Hugging Face directory, Llama/Mistral/Qwen3/Gemma
    # (its config.json sets the model's shape, attention and RoPE, its tokenizer the data's;
    # --config.model.rope_* given on the command line win); 'run:WORKDIR[@STEP]' = another
    # run's weights, fresh optimizer (a new stage: how seq_len, RoPE, mesh or batch change on
    # purpose)
    config.init_from = ""
    # Length stages: trainings in a row from one another's weights, e.g. 1k then 8k tokens with a
    # larger RoPE base (training/stages.py; configs/extend_8k.py). () = one stage, this config.
    config.stages = ()
    config.cpu_devices = 4  # fake devices when the platform is CPU (set before JAX starts)
    config.tracker = "jsonl"  # 'wandb' | 'jsonl' | 'none' (wandb implies jsonl)
    config.wandb_project = "ringstripe"  # wandb project
    # wandb group: '' = S{seq_len}-{strategy}-{kernel}-{mesh}-{docs|nodocs}, so that runs
    # differing only in parallel.layout sit side by side (each named by its layout)
    config.wandb_group = ""
    config.wandb_mode = "offline"  # wandb mode unless WANDB_MODE is set: offline | online
    config.peak_tflops_per_device = 0.0  # MFU denominator; 0 = from the device table
    # A jax.profiler trace of num_steps steps from start_step into WORKDIR/profile/ (TensorBoard's
    # profile plugin, XProf, Perfetto), and one line at the end: where their time went
    # (training/analysis/profile.py). num_steps 0: off.
    config.profile = ml_collections.ConfigDict()
    config.profile.start_step = 5  # the first step traced (after the compiling first step)
    config.profile.num_steps = 0  # steps traced; 0 = no trace

    config.parallel = ml_collections.ConfigDict(type_safe=False)  # tile: 'auto' or a size
    # Three separate choices (parallel/README.md): where tokens sit on the seq shards, how keys and
    # values reach the queries, and what computes one (query block, key block) pair.
    # layout: 'ring' | 'striped' | 'zigzag' | 'balanced' | 'auto' (the planner's pick with the
    # strategy and tile it runs fastest with: the run's first lines say which)
    config.parallel.layout = "auto"
    # strategy: 'ring' (K/V hop device to device) | 'allgather' (one all-gather of K/V) |
    # 'ulysses' (all-to-all to head shards) | 'usp' (ulysses in groups x ring) | 'auto' (the
    # planner's pick for this mesh and device: scripts/plan.py prints the table)
    config.parallel.strategy = "auto"
    config.parallel.ulysses_degree = 0  # usp only: devices per all-to-all group (divides mesh.seq)
    # kernel: 'auto' (the backend's fused one: pallas_tpu on TPUs, pallas_gpu on GPUs; else
    # 'xla') | 'xla' (runs everywhere) | 'pallas_tpu' | 'pallas_gpu' (both interpreted, slowly,
    # on CPUs; pallas_tpu wants tiles that are multiples of 128 on a TPU)
    config.parallel.kernel = "auto"
    # tile: the kernel's (query x key) tile, 'auto' (the planner's: small tiles balance the
    # devices, each tile has a fixed cost; the run's first lines say which) | 512 | '256x128' |
    # (256, 128) | 0 (the kernel's largest default that divides the block)
    config.parallel.tile = config_dict.placeholder(object)  # 'auto' or a size or a pair
    config.parallel.tile = "auto"
    # mla_exchange (latent attention, model.mla): what the devices pass of a token's keys and
    # values: 'latent' (its latent and RoPE key: 576 values for DeepSeek-V3; each device expands
    # the blocks it receives) | 'full' (the expanded keys and values: 40,960) | 'auto' (the
    # planner prices both: scripts/plan.py --explain)
    config.parallel.mla_exchange = "auto"
    # linear_strategy (Gated DeltaNet layers, model.linear_attention): how their recurrence
    # crosses the 'seq' devices: 'state' (each device scans its block, the devices pass states:
    # bytes independent of the length) | 'heads' (all-to-alls give each device whole rows of
    # num_key_heads / mesh.seq heads: bytes grow with the length) | 'auto' (the planner prices
    # both: scripts/plan.py --explain)
    config.parallel.linear_strategy = "auto"

    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = 1  # data-parallel shards (-1: the remaining devices)
    config.mesh.seq = -1  # sequence shards, the attention ring (-1: the remaining devices)
    # Devices the experts of model.moe are split over (expert parallelism), folded into the
    # data x seq devices: 1, mesh.seq (the ring's devices), mesh.data, all of them, or groups
    # of neighbours (a divisor of mesh.seq; whole mesh rows). Tokens go to their experts'
    # devices and back with all-to-alls (model/moe.py).
    config.mesh.expert = 1

    vocab_size = ml_collections.FieldReference(2048)
    # Not type-safe: a memory switch holds 'auto' or a value of its own kind, and a copy of the
    # config (a stage's, a plan's) must still take either (validate_config checks the kinds).
    config.model = ml_collections.ConfigDict(type_safe=False)
    config.model.vocab_size = vocab_size  # tokenizer pieces = embedding rows
    config.model.d_model = 128  # residual width
    config.model.num_layers = 4  # transformer blocks
    config.model.num_heads = 4  # query heads
    config.model.num_kv_heads = 2  # key/value heads (GQA when fewer than num_heads)
    config.model.head_dim = 32  # per-head width
    config.model.mlp_dim = 384  # SwiGLU hidden width
    config.model.rope_theta = 10_000.0  # RoPE base
    # RoPE scaling, to extend a (pretrained) model's context: Hugging Face's rope_type and its
    # parameters (model/rope.py). 'default' = none; 'linear' divides every frequency by factor;
    # 'llama3' (Llama 3.1) and 'yarn' rescale by wavelength and need the pretrained length.
    config.model.rope_scaling = ml_collections.ConfigDict(dict(
        rope_type="default",  # 'default' | 'linear' | 'llama3' | 'yarn'
        factor=1.0,  # how many times longer the context becomes
        original_max_position_embeddings=0,  # llama3, yarn: the pretrained context length
        low_freq_factor=1.0, high_freq_factor=4.0,  # llama3's wavelength limits
        beta_fast=32.0, beta_slow=1.0,  # yarn's ramp, in rotations over the pretrained length
        attention_factor=0.0,  # yarn: cos/sin multiplier; 0 = 0.1 ln(factor) + 1
        mscale=0.0, mscale_all_dim=0.0,  # yarn (DeepSeek style) alternative to that factor
        truncate=True))  # yarn: ramp ends at whole dimensions
    config.model.norm_eps = 1e-5  # RMSNorm epsilon
    config.model.tie_embeddings = False  # output projection = embedding transposed
    # Attention per layer, as Hugging Face names it (Mistral, Qwen3, Gemma 2/3, GPT-OSS); the
    # defaults are a Llama model: every layer full causal attention, nothing else.
    # per layer 'full_attention' | 'sliding_attention' | 'linear_attention' (model.linear_attention
    # below) | 'mamba' (model.mamba below); () = all full
    config.model.layer_types = ()
    config.model.sliding_window = 0  # keys a sliding layer's query sees, itself included
    config.model.rope_local_theta = 0.0  # RoPE base of sliding layers (unscaled); 0 = rope_theta
    config.model.qk_norm = False  # RMSNorm of every query and key head (Qwen3, Gemma 3)
    config.model.attn_logit_soft_cap = 0.0  # attention scores c tanh(s / c) (Gemma 2); 0 = none
    config.model.final_logit_soft_cap = 0.0  # output logits c tanh(z / c) (Gemma 2); 0 = none
    config.model.attention_sinks = False  # a learned logit per head in its softmax (GPT-OSS)
    config.model.attention_bias = False  # biases on the q, k, v, o projections (GPT-OSS)
    config.model.qkv_bias = False  # biases on q, k, v only (Qwen2-MoE, GLM-4.5)
    config.model.partial_rotary_factor = 1.0  # RoPE on this share of each head (GLM-4.5: 0.5)
    # Qwen3-Next's softmax layers: each head's output times sigmoid of a gate the query
    # projection makes beside the query (twice as wide)
    config.model.attention_output_gate = False
    config.model.query_scale = 0.0  # scores scaled by query_scale^-0.5 (Gemma); 0 = head_dim
    config.model.mlp_activation = "silu"  # 'silu' (SwiGLU) | 'gelu_tanh' (GeGLU, Gemma)
    config.model.sandwich_norms = False  # Gemma: a norm after attention and the MLP as well
    config.model.embed_scale = False  # Gemma: embeddings times sqrt(d_model)
    # Granite's: the embedding times embedding_multiplier, each block's attention and MLP
    # outputs times residual_multiplier before they are added, the logits / logits_scaling
    config.model.embedding_multiplier = 1.0
    config.model.residual_multiplier = 1.0
    config.model.logits_scaling = 1.0
    # Mixture-of-experts layers (model/moe.py): none by default, every block's MLP dense.
    config.model.moe = ml_collections.ConfigDict(dict(
        num_experts=0,  # experts per sparse layer; 0 = a dense model
        top_k=2,  # experts each token goes to
        expert_mlp_dim=0,  # each expert's gated-MLP width; 0 = mlp_dim
        # 'softmax_topk' (Qwen3-MoE, Mixtral, DeepSeek-V2) | 'topk_softmax' (GPT-OSS) |
        # 'sigmoid_topk' (DeepSeek-V3, GLM-4.5: chosen by sigmoid + a correction bias)
        router="softmax_topk",
        norm_topk_prob=True,  # softmax/sigmoid_topk: the k weights renormalised to sum to 1
        n_group=1, topk_group=1,  # DeepSeek: choose among the best topk_group of n_group groups
        routed_scaling_factor=1.0,  # the routed experts' weights times this (DeepSeek-V3: 2.5)
        bias_update_speed=0.0,  # sigmoid_topk: the correction bias's step (DeepSeek-V3: 0.001)
        num_shared_experts=0,  # experts every token goes through (DeepSeek, GLM-4.5, Qwen2-MoE)
        shared_expert_mlp_dim=0,  # a shared expert's width; 0 = expert_mlp_dim
        shared_expert_gate=False,  # the shared experts' output times sigmoid(x w) (Qwen2-MoE)
        first_dense_layers=0,  # the first k blocks dense (DeepSeek's first_k_dense_replace)
        capacity_factor=0.0,  # 0 = dropless; c: at most c tokens x top_k / experts an expert
        aux_loss_coef=0.0,  # load-balancing loss weight (Switch, Mixtral: 0.01-0.02)
        z_loss_coef=0.0,  # router z-loss weight (ST-MoE: 0.001)
        decoder_sparse_step=1,  # layer i sparse when (i + 1) % this == 0 (Qwen3-MoE's name)
        mlp_only_layers=(),  # layers kept dense
        expert_bias=False,  # biases on the router and the experts (GPT-OSS)
        swiglu_limit=0.0))  # GPT-OSS's clamped SwiGLU limit (7.0); 0 = act(gate) * up
    # Multi-head latent attention (model/mixers/latent.py: DeepSeek-V2/V3, Kimi K2): none by default. With
    # kv_lora_rank > 0 every layer's keys and values come from a latent that width and one RoPE
    # key shared by the heads; head_dim and num_kv_heads do not apply to it.
    config.model.mla = ml_collections.ConfigDict(dict(
        kv_lora_rank=0,  # the latent's width (DeepSeek-V3: 512); 0 = ordinary attention
        q_lora_rank=0,  # the queries' latent (DeepSeek-V3: 1536); 0 = queries from x directly
        qk_nope_head_dim=128, qk_rope_head_dim=64,  # a head's query/key parts without, with RoPE
        v_head_dim=128,  # a head's value width
        rope_interleave=True))  # RoPE pairs (2i, 2i+1), DeepSeek's layout (False: halves)
    # Gated DeltaNet layers (model/mixers/gated_deltanet.py: Qwen3-Next), the blocks whose layer_types
    # entry is 'linear_attention': none by default. A state of key_head_dim x value_head_dim a
    # value head replaces the keys and values; its sequence is split over the 'seq' devices by
    # passing states (parallel.linear_strategy).
    config.model.linear_attention = ml_collections.ConfigDict(dict(
        num_key_heads=0,  # heads of q and k (Qwen3-Next-80B: 16); 0 = no such layers
        num_value_heads=0,  # heads of v, a multiple of num_key_heads (Qwen3-Next-80B: 32)
        key_head_dim=128, value_head_dim=128,
        conv_kernel=4,  # the short causal convolution over q, k and v, in tokens
        chunk_size=64))  # tokens the rule takes at once (numerics only)
    # Mamba2 layers (model/mixers/mamba2.py: Granite 4.0's hybrids), the blocks whose layer_types entry
    # is 'mamba': none by default. A state of state_size x head_dim a head; split over the 'seq'
    # devices as the Gated DeltaNet layers are (parallel.linear_strategy).
    config.model.mamba = ml_collections.ConfigDict(dict(
        num_heads=0,  # 0 = no such layers (Granite-4.0-H-Small: 128)
        head_dim=64, state_size=128,
        num_groups=1,  # groups of heads sharing B and C ('heads' splits them over devices)
        conv_kernel=4, conv_bias=True,  # the short causal convolution over x, B and C
        chunk_size=64))  # tokens the rule takes at once (numerics only)
    # Memory switches, 'auto': the planner turns on what the run needs to fit its devices and
    # no more, the fastest setting it predicts to fit (planner/switches.py; the run's first
    # lines say what it chose). A value set here, in a config or on the command line wins.
    for switch in ("remat", "remat_policy", "scan_layers", "loss_chunk", "mlp_chunk",
                   "linear_chunk"):
        config.model[switch] = config_dict.placeholder(object)  # 'auto' or a value of any type
        config.model[switch] = "auto"
    # remat: recompute each block in the backward pass (True | False)
    # remat_policy: with remat, a block keeps 'nothing' | 'attention' (its attention's output:
    #   the backward does not rerun the attention forward) | 'dots' (matmuls) | 'offload' (its
    #   input, in host memory)
    # scan_layers: one lax.scan over stacked blocks: compile time flat in depth (True | False)
    # loss_chunk, mlp_chunk: per-token work a chunk of each device's tokens at a time (0 = all
    #   at once; a divisor of seq_len / mesh.seq): the output projection + loss never makes
    #   [B, S, vocab] logits, the MLP never [B, S, mlp_dim]
    # linear_chunk: Gated DeltaNet and Mamba2 layers a piece of each device's tokens at a time,
    #   the state carried (0 = the whole block; parallel/recurrent/pieces.py)
    config.model.dtype = "float32"  # compute dtype ('bfloat16' on accelerators)
    config.model.param_dtype = "float32"  # parameter and optimizer-state dtype

    config.data = ml_collections.ConfigDict()
    config.data.source = "stdlib"  # 'stdlib' | a text file | a directory | a glob | 'tfds:NAME[/CONFIG][:VERSION][:SPLIT]'
    config.data.tfds_data_dir = ""  # prepared TFDS data (local path or gs://); '' = TFDS default
    config.data.tfds_text_field = "text"  # TFDS feature holding each example's text
    config.data.tokenizer_path = ""  # a sentencepiece .model; '' = train one on the source
    config.data.vocab_size = vocab_size  # pieces when training the tokenizer (= model.vocab_size)
    config.data.tokenizer_model_type = "bpe"  # sentencepiece model type when training
    config.data.cache_dir = ""  # tokenizer and token cache; '' = WORKDIR/cache
    config.data.max_bytes = 0  # tokenize at most this many bytes of the source; 0 = all
    config.data.eval_fraction = 0.005  # held-out tail of the token stream for evaluation
    config.data.mask_documents = True  # attention stays within documents (EOS boundaries)
    config.data.reset_positions = True  # RoPE positions restart at each document
    config.data.loader = "thread"  # 'thread' (a prefetch thread) | 'grain' (grain pipeline)
    config.data.grain_workers = 0  # with loader='grain': 0 = threads, N = worker processes
    # Share of training rows made passkey examples (a key hidden in the row's text, asked for at
    # its end: the retrieval probes' task, scripts/eval_long.py); 0 = plain text only
    config.data.passkey_fraction = 0.0
    # With passkey examples: 0 = one example fills a row; else rows are cut into examples of
    # this many tokens or more (several per row, of many lengths, each its own document)
    config.data.passkey_min_len = 0
    config.data.passkey_weight = 1.0  # loss weight of the answer's digits (1 = like any token)
    # Share of the training keys that repeat a digit in a row (30039), the copy's hard case;
    # 0 = as drawn uniformly (about a third)
    config.data.passkey_repeats = 0.0

    config.optim = ml_collections.ConfigDict()
    config.optim.learning_rate = 3e-3  # peak learning rate
    config.optim.warmup_steps = 20  # linear warmup steps
    config.optim.min_lr_ratio = 0.1  # final learning rate / peak (cosine decay)
    config.optim.b1 = 0.9  # AdamW beta1
    config.optim.b2 = 0.95  # AdamW beta2
    config.optim.eps = 1e-8  # AdamW epsilon
    config.optim.weight_decay = 0.1  # AdamW decoupled weight decay (matrices only)
    config.optim.grad_clip = 1.0  # clip gradients to this global norm
    config.optim.grad_accum_steps = 1  # micro-batches per step
    config.optim.skip_nonfinite = False  # skip a batch with NaN/Inf loss (else stop with an error)
    config.optim.max_skipped_steps = 10  # with skip_nonfinite: stop (exit 3) after this many in a row
    return config
