"""`usp`: the 'seq' axis of N devices as u Ulysses devices x N / u ring steps (unified sequence
parallelism).

Devices d = g u + j (g = 0 .. N/u - 1, j = 0 .. u - 1): each group g of u consecutive devices
trades heads for sequence with an all-to-all, as `ulysses` does over all N; the devices with the
same j in every group (same heads) then run the ring over the N / u groups, blocks of u n tokens
hopping u devices along 'seq'. Consecutive devices form the groups because they are the ones a
pod or a host links fastest, and the all-to-all moves more often than the ring's hops.

u = 1 is the ring, u = N is ulysses. Chosen with `attention(..., strategy='usp',
ulysses_degree=u)`, config `parallel.ulysses_degree`; u must divide N and the query heads.
"""

from __future__ import annotations

import dataclasses

from parallel.strategies.ulysses import Ulysses, check_heads


class Usp(Ulysses):
    name = "usp"
    options = ("ulysses_degree",)

    def configured(self, num_shards, q_heads, ulysses_degree=None, **options):
        divisors = [u for u in range(1, num_shards + 1) if num_shards % u == 0]
        if ulysses_degree is None:
            raise ValueError(f"strategy 'usp' needs ulysses_degree: one of {divisors} (devices "
                             f"per all-to-all group of the {num_shards} 'seq' shards)")
        if ulysses_degree not in divisors:
            raise ValueError(f"ulysses_degree={ulysses_degree} does not divide the {num_shards} "
                             f"'seq' shards: choose one of {divisors}")
        check_heads(ulysses_degree, q_heads, num_shards)
        return dataclasses.replace(self, degree=ulysses_degree)

    def label(self, degree, num_shards=None):
        return f"usp {degree}" + (f"x{num_shards // degree}" if num_shards else "")

    def degree_in(self, rest):
        return int(rest.split("x")[0])

    def option_values(self, degree):
        return {"ulysses_degree": degree}

    def degrees(self, num_shards, q_heads):
        """Strictly between the ring (u = 1) and ulysses (u = N), which price themselves."""
        return [u for u in range(2, num_shards) if num_shards % u == 0 and q_heads % u == 0]


STRATEGY = Usp()
