"""A run resolved once, before anything is built or written: its attention (every 'auto' of
parallel.* filled: planner/recommend.py) and its memory switches (every 'auto' of model.remat,
remat_policy, scan_layers, loss_chunk, mlp_chunk filled: planner/switches.py), the model config
that holds both, and what the planner predicts for it. Every part of a run reads this one
frozen value; the config it came from is not changed.

    resolved = resolve_run(config, (data, seq), platform, device_kind)
    resolved.attention   parallel.AttentionChoice     resolved.model     model.ModelConfig
    resolved.switches    model.MemorySwitches         resolved.line()    what auto chose, why

The order: the switches are searched with the configured attention (the ring standing in for
strategy 'auto', whose K/V buffers the memory terms count), then the strategy is chosen with
those switches, and if that changed the attention the switches are searched again for it.
"""

from __future__ import annotations

import dataclasses

import model
import parallel
import run_config
from parallel.experts import RAGGED_PLATFORMS
from planner import linear_strategy, mla_exchange, recommend
from planner.attention import choice_from_config
from planner.devices import Device, device_for_kind, on_host
from model.mixers import recurrent_layers
from planner.run import make_run
from planner.switches import AUTO_SHARE, given, resolve_switches

GB = 1e9


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    mesh_shape: tuple[int, int]  # (data, seq)
    attention: parallel.AttentionChoice
    switches: model.MemorySwitches
    model: model.ModelConfig  # config.model with the attention and switches above
    device: str  # the planner's device, e.g. 'CPU (fake device)'
    step_s: float  # predicted seconds per step
    bytes_per_device: float  # analytic memory per device
    device_bytes: float  # what a device has (fake CPU devices: their share of the host)
    auto_switches: tuple[str, ...]  # the switches the config left 'auto'
    auto_attention: tuple[str, ...] = ()  # 'layout', 'strategy', 'tile' the config left 'auto'
    candidates: tuple = dataclasses.field(default=(), compare=False, repr=False)
    # The (strategy, degree, tile) candidates weighed where the config leaves them 'auto', best
    # first (planner/recommend.py); none where it sets them.
    attention_candidates: tuple = dataclasses.field(default=(), compare=False, repr=False)
    # latent attention: planner/mla_exchange.price's figures for both exchanges ({} without)
    mla_prices: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # Gated DeltaNet layers over 'seq' devices: planner/linear_strategy.price's figures ({} else)
    linear_prices: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def fits(self) -> bool:
        return not self.device_bytes or self.bytes_per_device <= AUTO_SHARE * self.device_bytes

    def line(self) -> str:
        """What 'auto' chose and why, in one line: the attention (layout, strategy, tile) where
        the strategy or the tile was left to it, the memory switches where any was, the
        predicted memory and step; '' when the config left nothing to it."""
        if not (self.auto_attention or self.auto_switches):
            return ""
        chose, weighed = [], []
        if self.auto_attention:
            chose.append(self.attention.label())
            weighed.append(f"{len(self.attention_candidates)} attention")
        if self.auto_switches:
            chose.append(self.switches.label())
            weighed.append(f"{len(self.candidates)} memory")
        verdict = "fits" if self.fits else "does NOT fit: the least memory of any candidate"
        return (f"auto ({', '.join(self.auto_attention + self.auto_switches)}) -> "
                f"{'; '.join(chose)}: predicted {self.bytes_per_device / GB:.2f} GB per device "
                f"of {self.device_bytes / GB:.1f} ({verdict}), {self.step_s:.3g} s per step on "
                f"{self.device}; fastest of {' and '.join(weighed)} candidates "
                f"(scripts/plan.py --explain)")

    def keeping(self, recorded: dict) -> "ResolvedRun":
        """This run with the switches it left 'auto' set as in `recorded` (a checkpoint's
        memory_switches): a resume runs the program it saved, whatever this host would pick
        (scan_layers decides how the weights are stacked). Itself when nothing changes."""
        values = {k: recorded[k] for k in self.auto_switches if k in recorded}
        switches = dataclasses.replace(self.switches, **values)
        if switches == self.switches:
            return self
        return dataclasses.replace(self, switches=switches,
                                   model=dataclasses.replace(self.model, **switches.record()))

    def record(self) -> dict:
        """One flat row: what the metrics and the 'resumed' event carry."""
        return {**self.attention.record(), **self.switches.record(),
                "predicted_step_s": self.step_s, "predicted_bytes": self.bytes_per_device}

    def sections(self) -> dict:
        """What a checkpoint records beside its config, and wandb shows beside it: the
        attention and the memory switches as resolved (training/resume.py reads them back)."""
        return {"attention": self.attention.record(), "memory_switches": self.switches.record()}


def run_device(device_kind: str, devices: int) -> Device:
    """The planner's device for jax's `device_kind`, as `devices` of them see it here."""
    return on_host(device_for_kind(device_kind), devices)


def resolve_run(config, mesh_shape, platform: str, device_kind: str,
                device: Device | None = None, documents=None) -> ResolvedRun:
    """The run `config` makes on a (data, seq) mesh of `device_kind` devices (jax's name; or
    `device`, one of the planner's, for a plan). ValueError, one line, for an attention that
    cannot run."""
    config = run_config.typed(config)  # a config file's ConfigDict, or its RunConfig
    devices = mesh_shape[0] * mesh_shape[1]
    device = device or run_device(device_kind, devices)
    run = make_run(config, devices, tuple(mesh_shape))
    stand_in = choice_from_config(config, mesh_shape[1], platform)  # 'auto': the ring's
    switches, rows = resolve_switches(config, run, stand_in, device, documents)
    attention, weighed = recommend.resolve_on_device(config, mesh_shape, platform, device,
                                                     switches, documents)
    if attention != stand_in:
        switches, rows = resolve_switches(config, run, attention, device, documents)
    shapes = model.ModelConfig.from_config(config.model, switches=switches)
    attention = dataclasses.replace(attention, mla_exchange=mla_exchange.resolve(
        config, attention, shapes, mesh_shape[1], device), linear_strategy=linear_strategy.resolve(
        config, shapes, attention.layout, mesh_shape[1], device, run.rows))
    if (attention.linear_strategy == "heads" and mesh_shape[1] > 1
            and "linear_chunk" not in given(config.model)):
        switches = dataclasses.replace(switches, linear_chunk=0)  # 'heads' runs whole
    linear_prices = {} if not recurrent_layers(shapes) or mesh_shape[1] == 1 else dict(
        linear_strategy.price(shapes, attention.layout, config.seq_len, mesh_shape[1], device,
                              run.rows), configured=config.parallel.linear_strategy)
    mla_prices = {} if not shapes.mla.enabled else dict(
        mla_exchange.price(shapes, attention.ulysses_degree, config.seq_len, mesh_shape[1],
                           device, run.rows),
        crossover=mla_exchange.crossover(shapes, attention.ulysses_degree, mesh_shape[1],
                                         device), configured=config.parallel.mla_exchange)
    best = rows[0]
    return ResolvedRun(
        mesh_shape=tuple(mesh_shape), attention=attention, switches=switches,
        model=model.ModelConfig.from_config(
            config.model, switches, expert_devices=config.mesh.expert,
            ragged_exchange=platform in RAGGED_PLATFORMS),
        device=device.title, step_s=best["step_s"], bytes_per_device=best["total_bytes"],
        device_bytes=device.memory_bytes,
        auto_switches=tuple(k for k in model.MemorySwitches.fields()
                            if k not in given(config.model) and (
                                k != "linear_chunk" or recurrent_layers(config.model))),
        candidates=tuple(rows), attention_candidates=tuple(weighed),
        auto_attention=recommend.left_open(config), mla_prices=mla_prices,
        linear_prices=linear_prices)
