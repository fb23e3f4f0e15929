"""What one step costs each device, read from its compiled (partitioned) program.

`compiled_cost(compiled)` reads the collectives XLA put into a program after partitioning it
over a mesh (the HLO text of `jax.jit(f).lower(...).compile()`), counts how often each one
executes (a collective inside a loop once per iteration, where XLA knows the trip count), and
adds up the bytes each device receives through them. It also reports XLA's estimate of the
floating-point operations each device runs.

Bytes received per device, for a collective over groups of `g` devices on an array of `B`
bytes (the result's, or for a reduce-scatter the input's):

| collective | bytes received | why |
| --- | --- | --- |
| all-gather | `B (g - 1) / g` | every other device's part |
| all-to-all | `B (g - 1) / g` | every other device's part of the result |
| reduce-scatter | `B (g - 1) / g` | every other device's contribution to its part |
| all-reduce | `2 B (g - 1) / g` | a reduce-scatter, then an all-gather (a ring's cost) |
| collective-permute | `B` | the whole array, from one peer |

A conditional (`lax.cond`, `lax.switch`: a refresh every k steps, a first step) runs one
branch: `received_bytes` takes each conditional's cheapest branch (a plain step),
`received_bytes_costliest` its costliest (a refresh step).

XLA's cost analysis counts no work in a library call (a custom call): the decompositions that
LAPACK or cuSOLVER run (SOAP's eigenvectors and QR, GaLore's SVD). `compiled_cost` counts them
itself from their shapes, with the textbook operation counts (Golub and Van Loan, *Matrix
Computations*, 4th ed.; an `m x n` matrix, `m >= n`, a batch counted per matrix), as many
times as they run (loop trip counts, one branch of a conditional):

| call | floating-point operations |
| --- | --- |
| symmetric eigendecomposition with vectors (`syevd`, `heevd`; the Jacobi `syevj`) | `9 n^3` |
| QR (`geqrf`), forming its Q (`orgqr`, `ungqr`) | `2 m n^2 - 2 n^3 / 3` each |
| SVD with vectors (`gesdd`, `gesvd`, `gesvdj`) | `4 m^2 n + 8 m n^2 + 9 n^3` |
| Cholesky (`potrf`) | `n^3 / 3` |
| LU (`getrf`) | `2 n^3 / 3` |
| triangular solve (`trsm`): an `n x n` factor, `k` right-hand sides | `n^2 k` |
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

_ITEMSIZE = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_COLLECTIVES = ("all-gather", "all-to-all", "reduce-scatter", "all-reduce", "collective-permute")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program.

    Args:
        kind: "all-gather", "all-to-all", "reduce-scatter", "all-reduce" or "collective-permute".
        received_bytes: the bytes each device receives each time it runs.
        executions: how many times it runs per step (loop trip counts multiplied), on the plain
            path.
        group_size: the number of devices in each of its groups.
        computation: the name of the HLO computation holding it.
    """

    kind: str
    received_bytes: float
    executions: int
    group_size: int
    computation: str


@dataclasses.dataclass(frozen=True)
class CompiledCost:
    """What one run of a compiled program costs each device (made by `compiled_cost`).

    Args:
        received_bytes: bytes each device receives through collectives, taking the cheapest
            branch of every conditional (a plain step).
        received_bytes_costliest: the same, taking the costliest branch (a refresh step).
        flops: XLA's estimate of the floating-point operations each device runs (its cost
            analysis: loop bodies counted once, whatever their trip count).
        collectives: every collective on the plain path.
        unknown_trip_counts: loops holding collectives whose trip count XLA does not know (each
            counted once).
        decomposition_flops: the floating-point operations of the library calls each device
            runs (decompositions, triangular solves: see the module's docstring), which `flops`
            leaves out, on the plain path.
        decomposition_flops_costliest: the same on the costliest path (a refresh step).
    """

    received_bytes: float
    received_bytes_costliest: float
    flops: float
    collectives: tuple[Collective, ...]
    unknown_trip_counts: int
    decomposition_flops: float = 0.0
    decomposition_flops_costliest: float = 0.0

    def by_kind(self) -> dict[str, float]:
        """Bytes received per device on the plain path, by kind of collective."""
        totals: dict[str, float] = {}
        for c in self.collectives:
            totals[c.kind] = totals.get(c.kind, 0.0) + c.received_bytes * c.executions
        return totals


def compiled_cost(compiled: Any) -> CompiledCost:
    """What one run of `compiled` (a `jax.stages.Compiled`, or its HLO text) costs each device.

    Args:
        compiled: `jax.jit(f).lower(*args).compile()`, or the text of its `as_text()`.

    Example:
        >>> compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(model, optimizer, x, y).compile()
        >>> cost = modopt.sharding.compiled_cost(compiled)
        >>> cost.received_bytes / parameter_bytes_per_device
    """
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    flops = 0.0
    if not isinstance(compiled, str):
        analysis = compiled.cost_analysis()
        if isinstance(analysis, (list, tuple)):
            analysis = analysis[0] if analysis else {}
        flops = float((analysis or {}).get("flops", 0.0))
    program = _Program(text)
    plain = program.traffic(cheapest=True)
    costliest = program.traffic(cheapest=False)
    return CompiledCost(
        received_bytes=plain.bytes,
        received_bytes_costliest=costliest.bytes,
        flops=flops,
        collectives=tuple(plain.collectives),
        unknown_trip_counts=plain.unknown,
        decomposition_flops=plain.decomposition_flops,
        decomposition_flops_costliest=costliest.decomposition_flops,
    )


@dataclasses.dataclass
class _Traffic:
    """What one path through a computation costs a device: the bytes it receives, its
    collectives, loops of unknown trip count among them, and the library calls' operations."""

    bytes: float = 0.0
    collectives: list = dataclasses.field(default_factory=list)
    unknown: int = 0
    decomposition_flops: float = 0.0

    def add(self, other: _Traffic, times: int = 1) -> None:
        self.bytes += other.bytes * times
        self.unknown += other.unknown
        self.collectives += [dataclasses.replace(c, executions=c.executions * times) for c in other.collectives]
        self.decomposition_flops += other.decomposition_flops * times

    def rank(self) -> tuple[float, float]:
        """How costly the path is: by bytes received, then by the library calls' operations."""
        return self.bytes, self.decomposition_flops


@dataclasses.dataclass
class _Instruction:
    name: str
    type: str
    opcode: str
    rest: str  # operands and attributes


class _Program:
    """The computations of an HLO module's text, and the traffic of each."""

    def __init__(self, text: str):
        self.computations: dict[str, list[_Instruction]] = {}
        self.entry = None
        current = None
        for line in text.splitlines():
            header = _COMPUTATION.match(line)
            if header and not line.lstrip().startswith(("ROOT", "%" + header.group(1) + " =")):
                current = header.group(1)
                self.computations[current] = []
                if line.lstrip().startswith("ENTRY"):
                    self.entry = current
                continue
            if current is None:
                continue
            if line.strip() == "}":
                current = None
                continue
            match = _INSTRUCTION.match(line)
            if match:
                self.computations[current].append(_Instruction(*match.groups()))
        if self.entry is None:
            raise ValueError("compiled_cost: no ENTRY computation in the program's text.")
        partitions = re.search(r"num_partitions=(\d+)", text)
        self.devices = int(partitions.group(1)) if partitions else 1
        self.types = {i.name: i.type for instructions in self.computations.values() for i in instructions}
        self._memo: dict[tuple[str, bool], _Traffic] = {}

    def traffic(self, cheapest: bool, computation: str | None = None) -> _Traffic:
        name = computation or self.entry
        key = (name, cheapest)
        if key in self._memo:
            return self._memo[key]
        total = _Traffic()
        self._memo[key] = total  # a cycle (none in valid HLO) counts once
        for instruction in self.computations.get(name, []):
            opcode = instruction.opcode
            base = opcode[: -len("-start")] if opcode.endswith("-start") else opcode
            if base in _COLLECTIVES:
                total.add(_Traffic(*self._collective(instruction, base, name)))
                continue
            if opcode == "custom-call":
                total.decomposition_flops += _decomposition_flops(instruction, self._operand_types(instruction))
                continue
            if opcode == "while":
                body = _attribute(instruction.rest, "body")
                trips = _trip_count(instruction.rest)
                inner = self.traffic(cheapest, body)
                total.add(inner, trips or 1)
                if trips is None and inner.collectives:
                    total.unknown += 1
                continue
            if opcode == "conditional":
                branches = _branches(instruction.rest)
                costs = [self.traffic(cheapest, b) for b in branches]
                if costs:
                    total.add(min(costs, key=_Traffic.rank) if cheapest else max(costs, key=_Traffic.rank))
                continue
            for callee in _callees(instruction.rest):
                total.add(self.traffic(cheapest, callee))
        return total

    def _collective(self, instruction: _Instruction, kind: str, computation: str) -> tuple[float, list, int]:
        group = _group_size(instruction.rest, self.devices)
        if kind == "collective-permute":
            size = _bytes(self._operand_types(instruction)) if instruction.opcode.endswith("-start") else _bytes(instruction.type)
            received = float(size)
        else:
            if instruction.opcode.endswith("-start"):
                operand = _bytes(self._operand_types(instruction))
                size = operand * group if kind == "all-gather" else operand
            else:
                size = _bytes(instruction.type) * (group if kind == "reduce-scatter" else 1)
            share = (group - 1) / group if group else 0.0
            received = size * share * (2 if kind == "all-reduce" else 1)
        if group == 1:
            received = 0.0
        collective = Collective(kind, received, 1, group, computation)
        return received, [collective] if received else [], 0

    def _operand_types(self, instruction: _Instruction) -> str:
        """The types of an instruction's operands (written inline, or looked up by name)."""
        operands = instruction.rest.split("), ")[0]
        if _ARRAY.search(operands):
            return operands
        return " ".join(self.types.get(name, "") for name in re.findall(r"%([\w.\-]+)", operands))


# A decomposition's operation count from its first result, the `(..., m, n)` matrix it
# decomposes (see the module's docstring). Keyed by the routine's name inside the call's target
# ("lapack_ssyevd_ffi", "cusolver_geqrf_ffi", ...); a triangular solve ("trsm") is counted from
# its factor and right-hand sides.
def _eigh(m: int, n: int) -> float:
    return 9 * n**3


def _qr(m: int, n: int) -> float:
    return 2 * max(m, n) * min(m, n) ** 2 - 2 * min(m, n) ** 3 / 3


def _svd(m: int, n: int) -> float:
    return 4 * max(m, n) ** 2 * min(m, n) + 8 * max(m, n) * min(m, n) ** 2 + 9 * min(m, n) ** 3


_DECOMPOSITIONS = {
    **dict.fromkeys(("syevd", "heevd", "syevj", "heevj"), _eigh),
    **dict.fromkeys(("geqrf", "orgqr", "ungqr"), _qr),
    **dict.fromkeys(("gesdd", "gesvd"), _svd),  # also cuSOLVER's Jacobi SVD, "gesvdj"
    "potrf": lambda m, n: n**3 / 3,
    "getrf": lambda m, n: 2 * n**3 / 3,
}
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def _decomposition_flops(instruction: _Instruction, operand_types: str) -> float:
    """The operations of a custom call that runs a decomposition or a triangular solve (0 for any
    other custom call), per the module's table, times its batch."""
    target = _TARGET.search(instruction.rest)
    name = target.group(1).lower() if target else ""
    result = _dims(instruction.type)
    if "trsm" in name:  # the factor (..., n, n) first among the operands; the result is the right-hand sides
        factor = _dims(operand_types)
        return float(math.prod(result)) * factor[-1] if len(factor) >= 2 and result else 0.0
    routine = next((r for r in _DECOMPOSITIONS if r in name), None)
    if routine is None or len(result) < 2:
        return 0.0
    return math.prod(result[:-2]) * float(_DECOMPOSITIONS[routine](result[-2], result[-1]))


def _dims(type_text: str) -> list[int]:
    """The dimensions of the first array in an HLO type."""
    arrays = _ARRAY.findall(type_text)
    return [int(d) for d in arrays[0][1].split(",") if d] if arrays else []


def _bytes(type_text: str) -> int:
    """The bytes of every array in an HLO type (a tuple's elements summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(type_text):
        size = _ITEMSIZE.get(dtype, 1 if dtype.startswith("f8") else None)
        if size is None:
            continue
        total += size * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _attribute(rest: str, name: str) -> str | None:
    match = re.search(rf"\b{name}=%?([\w.\-]+)", rest)
    return match.group(1) if match else None


def _trip_count(rest: str) -> int | None:
    match = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', rest)
    return int(match.group(1)) if match else None


def _branches(rest: str) -> list[str]:
    match = re.search(r"branch_computations=\{([^}]*)\}", rest)
    if match:
        return [b.strip().lstrip("%") for b in match.group(1).split(",") if b.strip()]
    return [b for b in (_attribute(rest, "true_computation"), _attribute(rest, "false_computation")) if b]


def _callees(rest: str) -> list[str]:
    """The computations an instruction runs once: a fusion's, a call's, an async wrapper's, a
    reducer's."""
    names = []
    for match in re.finditer(r"\b(?:calls|to_apply)=(\{[^}]*\}|%?[\w.\-]+)", rest):
        names += [n.strip().lstrip("%") for n in match.group(1).strip("{}").split(",") if n.strip()]
    return names


def _group_size(rest: str, devices: int) -> int:
    """The number of devices in each group of a collective's `replica_groups` (`devices`, the
    program's partition count, for one group of them all)."""
    match = re.search(r"replica_groups=(\S.*?)(?:,\s*[a-z_]+=|$)", rest)
    if not match or match.group(1).startswith("{}"):
        return devices
    text = match.group(1).strip()
    mesh = re.match(r"mesh\[(.*?)\]\s*\{(.*?)\}", text)
    if mesh:  # mesh['a'=2,'b'=4] {'b'}: the product of the listed axes' sizes
        sizes = dict((k.strip("'\" "), int(v)) for k, v in (p.split("=") for p in mesh.group(1).split(",")))
        axes = [a.strip("'\" ") for a in mesh.group(2).split(",") if a.strip()]
        return math.prod(sizes[a] for a in axes) if axes else math.prod(sizes.values())
    iota = re.match(r"\[([\d,]+)\]<=", text)
    if iota:  # [groups, size]<=[devices]
        dims = [int(d) for d in iota.group(1).split(",")]
        return dims[-1] if len(dims) > 1 else dims[0]
    groups = re.match(r"\{\{([\d,\s]*)\}", text)
    if groups:
        return len([d for d in groups.group(1).split(",") if d.strip()])
    return devices
