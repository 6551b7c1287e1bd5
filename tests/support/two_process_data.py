"""One row split over two processes, checked from inside them (tests/data/test_data_columns.py):

    python scripts/launch_local.py --processes 2 -- tests/support/two_process_data.py

2 processes x 2 fake CPU devices, mesh data 1 x seq 4, global_batch 1, S = 64: each process
holds 2 of the 4 seq blocks, so local_block gives it row [0] and 32 of the 64 columns. For every
layout, the global arrays that to_global and GrainPrefetcher build from those halves, gathered
to every process, equal the whole row built in one place. Prints "ok: 32 of 64 columns".
"""

import argparse

import process_group  # beside this file

S = 64


def main() -> None:
    process_group.join(argparse.ArgumentParser(), devices_per_process=2)
    import numpy as np
    from jax.experimental import multihost_utils

    import data
    import parallel

    mesh = parallel.make_mesh(1, 4)
    tokens = np.random.default_rng(5).integers(0, 20, 40 * S).astype(np.uint16)  # EOS = 3
    for layout in parallel.LAYOUTS:
        spec = data.BatchSpec(seq_len=S, global_batch=1, seed=2, layout=layout, num_seq_shards=4,
                              mask_documents=True, reset_positions=True, eos_id=3, tile=4)
        rows, columns = data.local_block(mesh, spec)
        assert list(rows) == [0] and len(columns) == S // 2, (rows, columns)
        want = data.batch_rows(tokens, spec, 2, [0])      # the whole row, for the comparison
        asked = []

        def batch_fn(step, r, c, spec=spec):
            asked.append(len(c))
            return data.batch_rows(tokens, spec, step, r, c)

        with data.GrainPrefetcher(batch_fn, mesh, spec, start_step=2, num_steps=1) as grain:
            batches = [data.to_global(batch_fn, 2, mesh, spec), grain.next()[1]]
        assert asked == [S // 2, S // 2], asked                # only its own columns
        for batch in batches:
            for name in data.FIELDS:
                for shard in batch[name].addressable_shards:
                    np.testing.assert_array_equal(np.asarray(shard.data), want[name][shard.index])
                whole = multihost_utils.process_allgather(batch[name], tiled=True)
                np.testing.assert_array_equal(whole, want[name], err_msg=f"{layout} {name}")
    print(f"ok: {len(columns)} of {S} columns", flush=True)


if __name__ == "__main__":
    main()
