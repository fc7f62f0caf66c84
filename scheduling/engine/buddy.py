"""Buddy free lists of one NVLink island: blocks of 2^k GPUs aligned to their index.

An island of ``size`` GPUs (indices ``base .. base+size-1`` on its node) is cut into *root* blocks:
one block when ``size`` is a power of two, otherwise its binary decomposition (6 = 4 + 2). Free
lists hold, per order ``k``, the offsets (relative to ``base``) of free blocks of ``2^k`` GPUs.

The lists always describe exactly the fully free, healthy GPUs: a GPU shared by fractional jobs
has been taken out as a unit block, and comes back (merging with its buddies) when its last share
leaves. Whoever asks for ``n`` GPUs takes the smallest free block of ``2^ceil(log2 n)`` GPUs and
uses its first ``n``; the rest of that block stays in the lists (as the smaller blocks the split
leaves), usable by fractional and small jobs.
"""

from __future__ import annotations


def order_for(n: int) -> int:
    """The order ``k`` of the smallest block ``2^k >= n``."""
    return max(0, (n - 1).bit_length())


class IslandBuddy:
    """Free lists of one island. Offsets are relative to the island's first GPU."""

    __slots__ = ("base", "size", "free", "_root_order")

    def __init__(self, base: int, size: int, unusable: tuple[int, ...] = ()):
        self.base = base
        self.size = size
        top = order_for(size) + 1
        self.free: list[set[int]] = [set() for _ in range(top)]
        self._root_order = [0] * size  # the order of the root block holding each GPU
        offset = 0
        for k in range(top - 1, -1, -1):  # binary decomposition, largest roots first
            if size - offset >= (1 << k):
                for g in range(offset, offset + (1 << k)):
                    self._root_order[g] = k
                self.free[k].add(offset)
                offset += 1 << k
        for g in unusable:
            if base <= g < base + size:
                self.take(g)

    # 1. Take one GPU: find the free block that holds it; split it down, returning each half that
    #    does not hold the GPU to the free list of its order, until the unit block is left.
    def take(self, gpu: int) -> None:
        rel = gpu - self.base
        for k in range(len(self.free)):
            off = rel & ~((1 << k) - 1)
            if off in self.free[k]:
                self.free[k].discard(off)
                while k > 0:
                    k -= 1
                    half = 1 << k
                    if rel >= off + half:
                        self.free[k].add(off)
                        off += half
                    else:
                        self.free[k].add(off + half)
                return
        raise ValueError(f"GPU {gpu} is not free")

    # 2. Give one GPU back: while its buddy (offset XOR 2^k) is free and the merged block stays
    #    inside the GPU's root block, take the buddy out and go up one order; then list the block.
    def give(self, gpu: int) -> None:
        rel = gpu - self.base
        off, k = rel, 0
        root = self._root_order[rel]
        while k < root:
            buddy = off ^ (1 << k)
            if buddy not in self.free[k]:
                break
            self.free[k].discard(buddy)
            off = min(off, buddy)
            k += 1
        if off in self.free[k]:
            raise ValueError(f"GPU {gpu} is already free")
        self.free[k].add(off)

    def find(self, n: int) -> int | None:
        """The first GPU (absolute index) of the smallest free block holding ``n``; lowest offset
        among blocks of that order, so the choice never depends on set order."""
        for k in range(order_for(n), len(self.free)):
            if self.free[k]:
                return self.base + min(self.free[k])
        return None

    def largest(self) -> int:
        """GPUs in the largest free block."""
        for k in range(len(self.free) - 1, -1, -1):
            if self.free[k]:
                return 1 << k
        return 0

    def blocks(self) -> list[tuple[int, int]]:
        """Every free block as ``(first GPU, size)``, sorted."""
        return sorted((self.base + off, 1 << k) for k, offs in enumerate(self.free) for off in offs)

    def free_count(self) -> int:
        return sum(len(offs) << k for k, offs in enumerate(self.free))
