"""Two processes restore one checkpoint directory and must take one decision, though only one of
them sees a problem (tests/training/test_faults.py):

    python scripts/launch_local.py --processes 2 -- tests/support/two_process_restore.py DIR damage|trouble

2 processes x 1 fake CPU device save steps 1 and 2 of a state sharded over both. Then each
restores the newest step for real, and process 1 alone reports an error afterwards, as if its
shard had failed a check: 'damage' (NOT_FOUND) or 'trouble' (RESOURCE_EXHAUSTED). Agreed, both
processes must move step 2 aside and restore step 1 (damage), or both stop with the same
CheckpointError and move nothing (trouble). Each prints what it did: "ok: restored 1",
"ok: refused".
"""

import argparse

import process_group  # beside this file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("fault", choices=["damage", "trouble"])
    args = process_group.join(parser, devices_per_process=1)
    import jax
    import jax.numpy as jnp
    import numpy as np

    import parallel
    from checkpoints import Checkpointer, CheckpointError, abstract_like

    mesh = parallel.make_mesh(1, 2)
    sharding = jax.sharding.NamedSharding(mesh, jax.P(parallel.SEQ))
    state = {"w": jax.device_put(jnp.arange(8.0), sharding)}
    saver = Checkpointer(args.directory, keep=5, async_save=False)
    for step in (1, 2):
        saver.save(step, jax.tree.map(lambda x: x * step, state), {"step": step})
    saver.close()

    error = (ValueError("NOT_FOUND: Error reading shard (injected)") if args.fault == "damage"
             else ValueError("RESOURCE_EXHAUSTED: Out of memory (injected)"))

    class OnlyProcessOneFails(Checkpointer):
        def restore(self, step, abstract_state):
            restored = super().restore(step, abstract_state)  # every process reads (collectives)
            if step == 2 and jax.process_index() == 1:
                raise error
            return restored

    said = []
    try:
        step, restored, _ = OnlyProcessOneFails(args.directory, keep=5).restore_latest(
            abstract_like(state), lambda step, meta: None, log=said.append)
    except CheckpointError as e:
        assert "does not look damaged, so nothing was moved" in str(e), e
        print("ok: refused", flush=True)
        return
    from jax.experimental import multihost_utils
    w = np.asarray(multihost_utils.process_allgather(restored["w"], tiled=True))
    np.testing.assert_array_equal(w, np.arange(8.0) * step)
    print(f"ok: restored {step}", flush=True)


if __name__ == "__main__":
    main()
