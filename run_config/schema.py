"""The run config's types: one frozen dataclass a section, named and nested as the config file
names its fields (config.seq_len, config.data.source, config.model.moe.top_k), so that a
reader writes the same `config.x.y` it always did. Every field is documented, with its
default, in configs/default.py, the one home of the defaults; run_config.build fills a config
from it. The model section is model.ModelConfig itself, its memory switches possibly 'auto'
until planner.resolve_run resolves them (ModelConfig.from_config).

The values derived from the fields are computed here, once: tokens_per_step, block (a
device's tokens of one sequence), parallel.tiles (the one spelling of "no tile given").
"""

from __future__ import annotations

import dataclasses

from model.config import ModelConfig
from parallel.choice import parse_tile


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    layout: str
    strategy: str
    ulysses_degree: int
    kernel: str
    tile: object  # 'auto', a size, 'QxK' or (q, k), 0: as the config gives it; read `tiles`
    mla_exchange: str  # 'auto' | 'latent' | 'full' (latent attention only)
    linear_strategy: str  # 'auto' | 'state' | 'heads' (Gated DeltaNet layers only)

    @property
    def tiles(self) -> tuple[int, int] | None:
        """(tile_q, tile_k); None where the planner picks ('auto'); (0, 0): the kernel's
        default for each call's length. ValueError, one line, for a value that is no tile."""
        return parse_tile(self.tile)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int  # -1: the devices left
    seq: int  # -1: the devices left
    expert: int


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str
    tfds_data_dir: str
    tfds_text_field: str
    tokenizer_path: str
    vocab_size: int
    tokenizer_model_type: str
    cache_dir: str
    max_bytes: int
    eval_fraction: float
    mask_documents: bool
    reset_positions: bool
    loader: str
    grain_workers: int
    passkey_fraction: float
    passkey_min_len: int
    passkey_weight: float
    passkey_repeats: float


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float
    warmup_steps: int
    min_lr_ratio: float
    b1: float
    b2: float
    eps: float
    weight_decay: float
    grad_clip: float
    grad_accum_steps: int
    skip_nonfinite: bool
    max_skipped_steps: int


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    start_step: int
    num_steps: int  # 0: no trace

    @property
    def steps(self) -> range:
        """The steps traced (empty when off)."""
        return range(self.start_step, self.start_step + self.num_steps)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole run, as train.py, scripts/plan.py and the launchers read it (run_config.build)."""

    seed: int
    seq_len: int
    global_batch_size: int
    num_train_steps: int
    eval_every_steps: int
    eval_batches: int
    eval_position_buckets: int
    log_every_steps: int
    checkpoint_every_steps: int
    checkpoint_keep: int
    stop_at_step: int
    resume_accepts: str
    init_from: str
    stages: tuple  # of dicts, each a stage's steps, name and fields (training/stages.py)
    cpu_devices: int
    tracker: str
    wandb_project: str
    wandb_group: str
    wandb_mode: str
    peak_tflops_per_device: float
    parallel: ParallelConfig
    mesh: MeshConfig
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    profile: ProfileConfig

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
