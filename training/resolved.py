"""The run resolved on this host (planner.resolve_run with this process's backend and
devices): before anything is written, on one document a row; again on the corpus's own rows
once the data is prepared, where documents are masked and the attention is left 'auto'; and
the one line that says what 'auto' chose (a resume keeping its checkpoint's switches).
"""

from __future__ import annotations

import jax

import data
import model
import parallel
from planner import resolve_run
from training import resume
from training.trackers import say


def resolve_here(config, mesh, documents=None):
    """planner.resolve_run for `mesh` on this process's backend and devices (documents:
    segment ids of sample rows, natural order)."""
    return resolve_run(config, mesh_shape_of(mesh), jax.default_backend(),
                       mesh.devices.flat[0].device_kind, documents=documents)


# Rows of the corpus the attention left 'auto' is resolved on, with documents masked (a few
# steps' worth; the planner's tile counts take about a second for these at 16k tokens).
DOCUMENT_ROWS = 8


def resolve_on_documents(config, mesh, resolved, prepared):
    """With documents masked and any of the attention left 'auto': the run resolved again on
    the corpus's own first rows (their document lengths decide which layout balances, and
    with which tile), and the batches laid out for it; else as they were."""
    if not (config.data.mask_documents and resolved.auto_attention):
        return resolved, prepared
    tokenizer, cache, spec = prepared
    rows = data.natural_segment_ids(cache, spec, max(DOCUMENT_ROWS, config.global_batch_size))
    resolved = resolve_here(config, mesh, documents=rows)
    return resolved, (tokenizer, cache, data.laid_out_for(spec, resolved.attention))


def mesh_shape_of(mesh) -> tuple[int, int]:
    return mesh.shape[parallel.DATA], mesh.shape[parallel.SEQ]


def announce_resolved(config, resolved, latest):
    """What 'auto' resolved to, in one line; a resume keeps the memory switches its checkpoint
    (`latest`, its record) was trained with, whatever this host would pick, and says so."""
    kept = as_checkpoint_ran(resolved, latest)
    if kept is not resolved:
        say(f"ringstripe: memory switches as the checkpoint was trained with: "
            f"{kept.switches.label()} (auto would pick {resolved.switches.label()} here)")
    elif resolved.line():
        say(f"ringstripe: {resolved.line()}")
    return kept


def as_checkpoint_ran(resolved, latest):
    """`resolved` with the memory switches it left 'auto' set as the checkpoint whose record is
    `latest` ran with (None: a start, `resolved` itself)."""
    if not latest:
        return resolved
    ran = resume.saved_config(latest).model  # the checkpoint's, 'auto' filled as it ran
    return resolved.keeping({k: getattr(ran, k) for k in model.MemorySwitches.fields()})
