"""Which keys a query sees, by original position: the one rule the kernels, the tile plan, the
block-pair skipping, the cost model and the halo exchange all read.

    Mask(causal=True)               key j visible to query i iff j <= i
    Mask(causal=True, window=W)     i - W < j <= i  (W counts the query itself, as Hugging
                                    Face's `sliding_window` does: W = 1 sees only itself)
    Mask(causal=False, window=W)    |i - j| < W
    Mask(causal=False)              every key

Segment ids (packed documents) are a second, separate rule: a pair is visible when both allow
it (parallel/kernels/base.py: `visible`).

The rule is applied to single positions (`visible`) and to ranges of positions (`may_meet`,
`all_visible`, `key_bounds`): a tile, or a device's block, holds original positions that increase
along it, so its first and last positions bound every pair it can form.

Example: Mask(True, window=3).visible(5, [2, 3, 4, 5, 6]) -> [False, True, True, True, False].
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Mask:
    causal: bool = True
    window: int | None = None  # W >= 1, or None for no window

    def visible(self, q_pos, k_pos):
        """Broadcasting positions -> bool array, or None when every pair is visible."""
        mask = None
        if self.causal:
            mask = k_pos <= q_pos
        if self.window is not None:
            near = q_pos - k_pos < self.window
            if not self.causal:
                near = near & (k_pos - q_pos < self.window)
            mask = near if mask is None else mask & near
        return mask

    def key_bounds(self, q_first, q_last):
        """(lowest, highest) original key position any query in [q_first, q_last] may see;
        None for no bound on that side."""
        high = q_last if self.causal else (
            None if self.window is None else q_last + self.window - 1)
        low = None if self.window is None else q_first - self.window + 1
        return low, high

    def query_bounds(self, k_pos):
        """(lowest, highest) query position that may see key position k_pos (arrays), the
        mirror of `key_bounds`; an unbounded side is the int32 extreme."""
        far = np.iinfo(np.int32).max
        low = k_pos if self.causal else (
            k_pos - far if self.window is None else k_pos - self.window + 1)
        high = k_pos + far if self.window is None else k_pos + self.window - 1
        return low, high

    def may_meet(self, q_first, q_last, k_first, k_last):
        """Whether some query in [q_first, q_last] may see some key in [k_first, k_last]
        (elementwise, broadcasting the four)."""
        low, high = self.key_bounds(q_first, q_last)
        meet = k_first == k_first  # all True, in the arrays' own kind (numpy or jax)
        if high is not None:
            meet = meet & (k_first <= high)
        if low is not None:
            meet = meet & (k_last >= low)
        return meet

    def all_visible(self, q_first, q_last, k_first, k_last):
        """Whether every query in [q_first, q_last] sees every key in [k_first, k_last]."""
        full = k_first == k_first
        if self.causal:
            full = full & (k_last <= q_first)
        if self.window is not None:
            full = full & (q_last - k_first < self.window)
            if not self.causal:
                full = full & (k_last - q_first < self.window)
        return full

    @property
    def bounded(self) -> bool:
        """True when a query sees a bounded stretch of keys (a window)."""
        return self.window is not None


def check_window(window) -> int | None:
    """The window as an int >= 1, or None; ValueError (one line) otherwise."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window={window!r} must be a positive int (keys a query sees, itself "
                         f"included) or None for no window")
    return int(window)


def as_mask(rule) -> Mask:
    """A Mask, or a bool meaning Mask(causal=rule) (the rule functions' older argument)."""
    return rule if isinstance(rule, Mask) else Mask(causal=bool(rule))
