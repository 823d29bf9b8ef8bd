"""Which layers a sparse method compresses, the others dense, for the fewest bytes while
the gain GraVAC measures stays at least ε (``controller: auto``'s ``split_layers``;
``benchmarks/layer_gains.py`` reads it too).

The gain is measured over the compressed layers only (docs/ALGORITHM.md §1): Σ kept
energy / Σ g_ef energy of those layers. A layer of gain g and energy e adds (g - ε) x e to
the slack that keeps the ratio >= ε. Every layer at or above ε is compressed (it adds
slack); then the others, in decreasing order of bytes saved per unit of slack they use,
while the slack stays >= 0 (greedy: the knapsack's ratio rule).

Example::

    layers = [LayerGain("a", gain=0.9, energy=0.3, saved=800),
              LayerGain("b", gain=0.6, energy=0.3, saved=800),
              LayerGain("c", gain=0.3, energy=0.3, saved=800)]
    compressed_layers(layers, epsilon=0.7)        # ["a", "b"]: gain (0.27 + 0.18) / 0.6
"""
from __future__ import annotations

from typing import NamedTuple, Sequence


class LayerGain(NamedTuple):
    """One layer of a method: its gain (kept / g_ef energy), g_ef's energy (any unit,
    the same for every layer) and the bytes compressing it saves against sending it
    dense (<= 0: compressing it saves nothing)."""

    name: str
    gain: float
    energy: float
    saved: float


def compressed_layers(layers: Sequence[LayerGain], epsilon: float) -> list[str]:
    """The names of the layers to compress, in ``layers``' order (empty: none can be)."""
    worth = [l for l in layers if l.saved > 0]

    def used(l: LayerGain) -> float:
        return (epsilon - l.gain) * l.energy

    chosen = {l.name for l in worth if l.gain >= epsilon}
    slack = sum(-used(l) for l in worth if l.name in chosen)
    below = [l for l in worth if l.gain < epsilon]
    for l in sorted(below, key=lambda l: l.saved / used(l) if used(l) > 0 else float("inf"),
                    reverse=True):
        if slack - used(l) >= 0:
            slack -= used(l)
            chosen.add(l.name)
    return [l.name for l in layers if l.name in chosen]


def measured_gain(layers: Sequence[LayerGain], names) -> float | None:
    """The gain over the layers ``names`` as GraVAC measures it (None: no energy)."""
    names = set(names)
    energy = sum(l.energy for l in layers if l.name in names)
    if energy <= 0:
        return None
    return sum(l.gain * l.energy for l in layers if l.name in names) / energy
