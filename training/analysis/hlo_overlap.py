"""Does a compiled loop hide its transfers behind its kernel? Read from the optimized,
scheduled HLO (`jax.jit(f).lower(...).compile().as_text()`), whose computations list their
instructions in the order the device runs them.

For every while loop whose body sends something asynchronously (collective-permute-start /
-done, all-gather-start / -done, ...), `loop_overlaps` reports each transfer: whether the
kernel call (a tpu_custom_call, directly or inside a conditional or call of the body) runs
between its start and its done (overlapped), and which pass the loop belongs to (the backward's
ops carry `transpose(` in their jax names).

    for loop in loop_overlaps(compiled.as_text()):
        print(loop.pass_, loop.body, [(t.kind, t.overlapped) for t in loop.transfers])
"""

from __future__ import annotations

import dataclasses
import math
import re

KERNEL = 'custom_call_target="tpu_custom_call"'
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_NAME = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")
_ASYNC = re.compile(r"= [^=]*? ([a-z\-]+)-start\(")
_DONE = re.compile(r" ([a-z\-]+)-done\(%([\w.\-]+)")
# Computations an instruction runs as part of itself (a fusion, a call, a conditional's
# branches); a nested while loop is a loop of its own, not this step's kernel call.
_CALLS = re.compile(r"(?:calls|to_apply|branch_computations|true_computation|"
                    r"false_computation)=\{?%?([\w.\-, %]+)\}?")
_WHILE = re.compile(r" while\(.*body=%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Transfer:
    kind: str  # collective-permute, all-gather, ...
    start: str  # the start instruction's name
    shape: str  # what it sends, e.g. 'bf16[2,1,2,4096,128]' (K and V stacked)
    source: str  # the jax operation it came from: 'ppermute' for a ring hop
    overlapped: bool  # a kernel call runs between start and done
    copies_before: int  # copy instructions of the sent operand's shape before the start


@dataclasses.dataclass(frozen=True)
class Loop:
    body: str
    pass_: str  # "forward" or "backward"
    kernels: int  # kernel calls in the body
    transfers: tuple[Transfer, ...]
    nested: bool  # the body runs loops of its own (a layer loop around the ring loops)


def computations(hlo: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines, in schedule order}."""
    comps, name = {}, None
    for line in hlo.splitlines():
        if name is None:
            m = _COMPUTATION.match(line)
            if m and "(" in line:
                name = m.group(1)
                comps[name] = []
        elif line.startswith("}"):
            name = None
        else:
            comps[name].append(line)
    return comps


def _called(line: str) -> list[str]:
    out = []
    for m in _CALLS.finditer(line):
        out += [c.strip().lstrip("%") for c in m.group(1).split(",") if c.strip()]
    return out


def _runs_kernel(line: str, comps: dict, seen: set) -> bool:
    """The instruction is a kernel call, or calls a computation that makes one."""
    if KERNEL in line:
        return True
    if " while(" in line:
        return False
    for callee in _called(line):
        if callee in comps and callee not in seen:
            seen.add(callee)
            if any(_runs_kernel(ln, comps, seen) for ln in comps[callee]):
                return True
    return False


def loop_overlaps(hlo: str) -> list[Loop]:
    """Every while loop body with an asynchronous transfer, as `Loop`s (module docstring)."""
    comps = computations(hlo)
    bodies = {m.group(1) for lines in comps.values() for ln in lines
              for m in [_WHILE.search(ln)] if m}
    loops = []
    for body in sorted(bodies):
        lines = comps.get(body, [])
        kernel_at = [i for i, ln in enumerate(lines) if _runs_kernel(ln, comps, set())]
        starts = {}
        for i, ln in enumerate(lines):
            name = _NAME.match(ln)
            if name and _ASYNC.search(ln) and "-start(" in ln:
                starts[name.group(1)] = (i, _ASYNC.search(ln).group(1))
        transfers = []
        for j, ln in enumerate(lines):
            done = _DONE.search(ln)
            if done and done.group(2) in starts:
                i, kind = starts[done.group(2)]
                shape = re.search(r"-start(?:\.\d+)? = \(?(\w+\[[\d,]*\])", lines[i])
                op = re.search(r'op_name="([^"]*)"', lines[i])
                source = op.group(1).rsplit("/", 1)[-1] if op else ""
                transfers.append(Transfer(kind, done.group(2), shape.group(1) if shape else "?",
                                          source,
                                          any(i < k < j for k in kernel_at),
                                          _copies_of_operand(lines, i)))
        transfers = [t for t in transfers if t.kind != "copy"]  # copy-start: memory moves
        if transfers:
            backward = any("transpose(" in ln for ln in lines if "op_name" in ln)
            loops.append(Loop(body, "backward" if backward else "forward", len(kernel_at),
                              tuple(transfers), any(" while(" in ln for ln in lines)))
    return loops


def _copies_of_operand(lines: list[str], start: int) -> int:
    """1 if the start's operand is a full copy made in the body just for the send, else 0."""
    operand = re.search(r"-start\(%([\w.\-]+)", lines[start])
    if not operand:
        return 0
    pattern = re.compile(rf"^\s*%{re.escape(operand.group(1))} = \S+ copy\(")
    return int(any(pattern.match(ln) for ln in lines[:start]))


def summary(loops: list[Loop]) -> dict[str, str]:
    """{pass: 'bf16[...] hidden, s32[...] exposed; ...'}: the ring loops' transfers (K/V, dK/dV,
    positions with segment ids: lax.ppermute hops in a loop that calls the kernel) and whether
    a kernel call hides them; loops alike (one per unrolled layer) once, with their count."""
    counts: dict[str, dict[str, int]] = {}
    for loop in loops:
        ring = [t for t in loop.transfers if t.source == "ppermute"]
        if not loop.kernels or not ring or loop.nested:
            continue
        text = ", ".join(f"{t.shape} {'hidden' if t.overlapped else 'exposed'}" for t in ring)
        alike = counts.setdefault(loop.pass_, {})
        alike[text] = alike.get(text, 0) + 1
    return {pass_: "; ".join(text + (f" (x{n} loops)" if n > 1 else "")
                             for text, n in alike.items())
            for pass_, alike in counts.items()}


_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1,
             "pred": 1, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_COLLECTIVE = re.compile(r"= (.+?) (collective-permute|all-gather|all-reduce|reduce-scatter|"
                         r"all-to-all|ragged-all-to-all)(-start)?\(")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each kind of collective moves in the program as written (each instruction once,
    whatever loop runs it: a ring loop's hop counts as one step's), from the optimized HLO:
    {'collective-permute': bytes, 'all-gather': ..., ...}. An instruction's size is its
    result's: every array of a tuple (an all-to-all of N operands, XLA:CPU's form, returns N
    arrays; a combined all-reduce one per operand), but for an asynchronous start only the
    first (its operand; the others are the result and scratch)."""
    out: dict[str, int] = {}
    for line in hlo.splitlines():
        found = _COLLECTIVE.search(line)
        if not found:
            continue
        arrays = _ARRAY.findall(found.group(1))
        size = 0
        for dtype, dims in arrays[:1] if found.group(3) else arrays:
            if dtype in _ITEMSIZE:
                size += _ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        if size:
            out[found.group(2)] = out.get(found.group(2), 0) + size
    return out
