"""Every field of a run config, declared once: its type, its default and what it means. One frozen
dataclass a section, named and nested as a config file names its fields (config.seq_len,
config.data.source, config.model.moe.top_k). The defaults are the embedded default run
(`make train`: a small Llama-style model learns Python from the standard library on 4 fake CPU
devices); configs/default.py is a ConfigDict made of them (run_config/config_dict.py), and every
other config file starts from it. The model section is model.ModelConfig, declared in model/
with its groups; in a run config its memory switches are 'auto' (RUN_MODEL).

The values derived from the fields are computed here, once: tokens_per_step, block (a
device's tokens of one sequence), parallel.tiles (the one reading of parallel.tile).
"""

from __future__ import annotations

import dataclasses

import parallel
from model.config import AUTO, MemorySwitches, ModelConfig
from parallel.choice import parse_tile

TRACKERS = ("wandb", "jsonl", "none")
LOADERS = ("thread", "grain")
WANDB_MODES = ("online", "offline", "disabled")


def check(node, prefix: str, checks) -> None:
    """ValueError, one line, for the first (field, ok, what it must be) that is not ok: each
    section checks its own fields where it is made (run_config.build makes it a ConfigError);
    what needs the devices, the platform or the data is training/validate.py's."""
    for field, ok, want in checks:
        if not ok:
            raise ValueError(f"{prefix}{field}={getattr(node, field)!r}: must be {want}")


# A run config leaves every memory switch to the planner: 'auto' turns on what the run needs to
# fit its devices and no more, the fastest setting it predicts to fit (planner/switches.py; the
# run's first lines say what it chose). A value set in a config or on the command line wins.
# (A model built in code, or read only for its shapes, takes MemorySwitches' own: all off.)
RUN_MODEL = ModelConfig(**dict.fromkeys(MemorySwitches.fields(), AUTO))


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Three separate choices (parallel/README.md): where tokens sit on the seq shards (layout),
    how keys and values reach the queries (strategy), and what computes one (query block, key
    block) pair (kernel, tile). 'auto' is the planner's pick, the fastest it predicts for this
    mesh and device (scripts/plan.py prints the table; the run's first lines say which)."""

    # 'ring' | 'striped' | 'zigzag' | 'balanced' | 'auto' (with the strategy and tile it runs
    # fastest with)
    layout: str = AUTO
    # 'ring' (K/V hop device to device) | 'allgather' (one all-gather of K/V) | 'ulysses'
    # (all-to-all to head shards) | 'usp' (ulysses in groups x ring) | 'auto'
    strategy: str = AUTO
    ulysses_degree: int = 0  # usp only: devices per all-to-all group (divides mesh.seq)
    # 'auto' (the backend's fused one: pallas_tpu on TPUs, pallas_gpu on GPUs; else 'xla') |
    # 'xla' (runs everywhere) | 'pallas_tpu' | 'pallas_gpu' (both interpreted, slowly, on CPUs;
    # pallas_tpu wants tiles that are multiples of 128 on a TPU)
    kernel: str = AUTO
    # The kernel's (query x key) tile: 'auto' (the planner's: small tiles balance the devices,
    # each tile has a fixed cost) | 512 | '256x128' | (256, 128) | 0 (the kernel's largest
    # default that divides the block). Read it as `tiles`.
    tile: object = AUTO
    # Latent attention (model.mla): what the devices pass of a token's keys and values:
    # 'latent' (its latent and RoPE key: 576 values for DeepSeek-V3; each device expands the
    # blocks it receives) | 'full' (the expanded keys and values: 40,960) | 'auto' (the planner
    # prices both: scripts/plan.py --explain)
    mla_exchange: str = AUTO
    # Recurrent layers (model.linear_attention, model.mamba): how their recurrence crosses the
    # 'seq' devices: 'state' (each device scans its block, the devices pass states: bytes
    # independent of the length) | 'heads' (all-to-alls give each device whole rows of some of
    # the heads: bytes grow with the length) | 'auto' (the planner prices both)
    linear_strategy: str = AUTO

    def __post_init__(self):
        if self.layout not in parallel.LAYOUTS and self.layout != AUTO:
            raise ValueError(f"parallel.layout={self.layout!r} is not a known layout: choose one "
                             f"of {', '.join(parallel.LAYOUTS)} or auto")
        if self.strategy not in parallel.STRATEGIES and self.strategy != AUTO:
            raise ValueError(f"parallel.strategy={self.strategy!r} is not a known strategy: "
                             f"choose one of {', '.join(parallel.STRATEGIES)} or auto")
        parse_tile(self.tile)  # ValueError, one line, for a value that is no tile

    @property
    def tiles(self) -> tuple[int, int] | None:
        """(tile_q, tile_k); None where the planner picks ('auto'); (0, 0): the kernel's
        default for each call's length. ValueError, one line, for a value that is no tile."""
        return parse_tile(self.tile)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = 1  # data-parallel shards (-1: the remaining devices)
    seq: int = -1  # sequence shards, the attention ring (-1: the remaining devices)
    # Devices the experts of model.moe are split over (expert parallelism), folded into the
    # data x seq devices: 1, mesh.seq (the ring's devices), mesh.data, all of them, or groups of
    # neighbours (a divisor of mesh.seq; whole mesh rows). Tokens go to their experts' devices
    # and back with all-to-alls (parallel/experts.py).
    expert: int = 1


@dataclasses.dataclass(frozen=True)
class DataConfig:
    # 'stdlib' | a text file | a directory | a glob | 'tfds:NAME[/CONFIG][:VERSION][:SPLIT]'
    source: str = "stdlib"
    tfds_data_dir: str = ""  # prepared TFDS data (local path or gs://); '' = TFDS default
    tfds_text_field: str = "text"  # TFDS feature holding each example's text
    tokenizer_path: str = ""  # a sentencepiece .model; '' = train one on the source
    # Pieces when training the tokenizer: always model.vocab_size (one value in a config file)
    vocab_size: int = RUN_MODEL.vocab_size
    tokenizer_model_type: str = "bpe"  # sentencepiece model type when training
    cache_dir: str = ""  # tokenizer and token cache; '' = WORKDIR/cache
    max_bytes: int = 0  # tokenize at most this many bytes of the source; 0 = all
    eval_fraction: float = 0.005  # held-out tail of the token stream for evaluation
    mask_documents: bool = True  # attention stays within documents (EOS boundaries)
    reset_positions: bool = True  # RoPE positions restart at each document
    loader: str = "thread"  # 'thread' (a prefetch thread) | 'grain' (grain pipeline)
    grain_workers: int = 0  # with loader='grain': 0 = threads, N = worker processes
    # Share of training rows made passkey examples (a key hidden in the row's text, asked for at
    # its end: the retrieval probes' task, scripts/eval_long.py); 0 = plain text only
    passkey_fraction: float = 0.0
    # With passkey examples: 0 = one example fills a row; else rows are cut into examples of
    # this many tokens or more (several per row, of many lengths, each its own document)
    passkey_min_len: int = 0
    passkey_weight: float = 1.0  # loss weight of the answer's digits (1 = like any token)
    # Share of the training keys that repeat a digit in a row (30039), the copy's hard case;
    # 0 = as drawn uniformly (about a third)
    passkey_repeats: float = 0.0

    def __post_init__(self):
        if self.loader not in LOADERS:
            raise ValueError(f"data.loader={self.loader!r}: choose one of {', '.join(LOADERS)}")
        if self.grain_workers < 0:
            raise ValueError(f"data.grain_workers={self.grain_workers} must be >= 0 (0 = "
                             f"threads, N = worker processes)")
        check(self, "data.", [
            ("eval_fraction", 0.0 <= self.eval_fraction < 1.0, "a fraction in [0, 1), e.g. 0.005"),
            ("max_bytes", self.max_bytes >= 0, "0 (all) or a byte count"),
            ("passkey_fraction", 0.0 <= self.passkey_fraction <= 1.0,
             "a share of the rows in [0, 1]"),
            ("passkey_weight", self.passkey_weight > 0,
             "a positive loss weight (1 = like any token)"),
            ("passkey_repeats", 0.0 <= self.passkey_repeats <= 1.0,
             "a share of the keys in [0, 1] (0 = as drawn, about a third)")])


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 3e-3  # peak learning rate
    warmup_steps: int = 20  # linear warmup steps
    min_lr_ratio: float = 0.1  # final learning rate / peak (cosine decay)
    b1: float = 0.9  # AdamW beta1
    b2: float = 0.95  # AdamW beta2
    eps: float = 1e-8  # AdamW epsilon
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    grad_clip: float = 1.0  # clip gradients to this global norm
    grad_accum_steps: int = 1  # micro-batches per step
    skip_nonfinite: bool = False  # skip a batch with NaN/Inf loss (else stop with an error)
    max_skipped_steps: int = 10  # with skip_nonfinite: stop (exit 3) after this many in a row

    def __post_init__(self):
        check(self, "optim.", [
            ("grad_accum_steps", self.grad_accum_steps >= 1, "at least 1"),
            ("learning_rate", self.learning_rate > 0, "a positive rate"),
            ("warmup_steps", self.warmup_steps >= 0, "0 or more")])
        if self.max_skipped_steps < 1:
            raise ValueError(f"optim.max_skipped_steps={self.max_skipped_steps} must be at "
                             f"least 1")


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """A jax.profiler trace of num_steps steps from start_step into WORKDIR/profile/
    (TensorBoard's profile plugin, XProf, Perfetto), and one line at the end: where their time
    went (training/analysis/profile.py)."""

    start_step: int = 5  # the first step traced (after the compiling first step)
    num_steps: int = 0  # steps traced; 0 = no trace

    def __post_init__(self):
        check(self, "profile.", [
            ("num_steps", self.num_steps >= 0, "0 (off) or a count of steps"),
            ("start_step", self.start_step >= 1, "a step from 1 (the first, which compiles: 2 "
             "or later shows steady steps)")])

    @property
    def steps(self) -> range:
        """The steps traced (empty when off)."""
        return range(self.start_step, self.start_step + self.num_steps)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole run, as train.py, scripts/plan.py and the launchers read it (run_config.build).
    Tokens per step: global_batch_size x seq_len (the defaults: 8 x 1024 = 8,192)."""

    seed: int = 0  # model init and data order
    seq_len: int = 1024  # tokens per sequence
    global_batch_size: int = 8  # sequences per step, all devices together
    num_train_steps: int = 200  # optimizer steps
    eval_every_steps: int = 50  # evaluate every this many steps (and at the end)
    eval_batches: int = 4  # batches in one evaluation
    # With each eval, the loss at this many equal ranges of original positions, on held-out
    # documents longer than seq_len read alone (eval/loss_by_position; 0 = off)
    eval_position_buckets: int = 8
    log_every_steps: int = 10  # metrics every this many steps
    checkpoint_every_steps: int = 50  # asynchronous checkpoint every this many steps (and at end)
    checkpoint_keep: int = 3  # keep the latest this many checkpoints
    stop_at_step: int = 0  # save and exit 0 after this step, as on preemption (0 = never)
    # A resume refuses a checkpoint whose run was defined otherwise (tokenizer, data, seq_len,
    # global_batch_size, seed, eval_fraction); name here, comma-separated, what you change on
    # purpose, e.g. 'seq_len' to continue the weights at a new length. Read as resume_accepted.
    resume_accepts: str = ""
    # Where the first weights come from (a start only; a resume restores the run's own):
    # '' = random from seed; 'hf:PATH' = a Hugging Face directory (its config.json sets the
    # model's shape, attention and RoPE, its tokenizer the data's; --config.model.rope_* given on
    # the command line win); 'run:WORKDIR[@STEP]' = another run's weights, fresh optimizer (a new
    # stage: how seq_len, RoPE, mesh or batch change on purpose)
    init_from: str = ""
    # Length stages: trainings in a row from one another's weights, e.g. 1k then 8k tokens with a
    # larger RoPE base (training/stages.py; configs/extend_8k.py); each a dict of its steps, name
    # and fields. () = one stage, this config.
    stages: tuple = ()
    cpu_devices: int = 4  # fake devices when the platform is CPU (set before JAX starts)
    tracker: str = "jsonl"  # 'wandb' | 'jsonl' | 'none' (wandb implies jsonl)
    wandb_project: str = "ringstripe"  # wandb project
    # wandb group: '' = S{seq_len}-{strategy}-{kernel}-{mesh}-{docs|nodocs}, so that runs
    # differing only in parallel.layout sit side by side (each named by its layout)
    wandb_group: str = ""
    wandb_mode: str = "offline"  # wandb mode unless WANDB_MODE is set: offline | online
    peak_tflops_per_device: float = 0.0  # MFU denominator; 0 = from the device table
    parallel: ParallelConfig = ParallelConfig()  # the sequence-parallel attention
    mesh: MeshConfig = MeshConfig()  # the devices' axes
    model: ModelConfig = RUN_MODEL  # the model (model/config.py), its memory switches 'auto'
    data: DataConfig = DataConfig()  # corpus, tokenizer, documents, passkey examples
    optim: OptimConfig = OptimConfig()  # AdamW and its schedule
    profile: ProfileConfig = ProfileConfig()  # a profiler trace of some steps

    def __post_init__(self):
        if self.tracker not in TRACKERS:
            raise ValueError(f"tracker={self.tracker!r}: choose one of {', '.join(TRACKERS)}")
        for name in ("seq_len", "global_batch_size", "num_train_steps", "eval_every_steps",
                     "log_every_steps", "eval_batches", "checkpoint_every_steps",
                     "checkpoint_keep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        check(self, "", [
            ("stop_at_step", self.stop_at_step >= 0, "0 (never) or a step"),
            ("eval_position_buckets", 0 <= self.eval_position_buckets <= self.seq_len,
             "0 (off) or a count of position ranges up to seq_len"),
            ("cpu_devices", self.cpu_devices >= 1, "at least 1"),
            ("wandb_mode", self.wandb_mode in WANDB_MODES, "online, offline or disabled")])
        check(self.data, "data.", [("passkey_min_len", 0 <= self.data.passkey_min_len
                                    <= self.seq_len, "0 (one example a row) or a length up "
                                    "to seq_len")])

    @property
    def tokens_per_step(self) -> int:
        """Tokens an optimizer step trains on: global_batch_size x seq_len."""
        return self.global_batch_size * self.seq_len

    def block(self, seq_shards: int) -> int:
        """A device's tokens of one sequence on a mesh of `seq_shards` 'seq' devices."""
        return self.seq_len // seq_shards

    @property
    def resume_accepted(self) -> tuple[str, ...]:
        """The run fields resume_accepts names (comma-separated in the config), in its order."""
        return tuple(n.strip() for n in self.resume_accepts.split(",") if n.strip())
