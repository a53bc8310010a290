"""Ranges of a shared KV cache's slots handed to answers and taken back (first fit, freed neighbours merged): each
answer of a batch gets the slots its prompt, its answer and one step need, so short answers leave room for more of
them than equal segments would (runtime/batching/batch_engine.py)."""


class SlotRanges:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free: list[tuple[int, int]] = [(0, capacity)]  # (start, width), in slot order

    def take(self, width: int) -> int | None:
        """The first free range of `width` slots (its start), or None while none is free."""
        for i, (start, free) in enumerate(self.free):
            if free >= width:
                self.free[i:i + 1] = [(start + width, free - width)] if free > width else []
                return start
        return None

    def give_back(self, start: int, width: int) -> None:
        self.free.append((start, width))
        self.free.sort()
        merged = [self.free[0]]
        for begin, size in self.free[1:]:
            last_begin, last_size = merged[-1]
            if last_begin + last_size == begin:
                merged[-1] = (last_begin, last_size + size)
            else:
                merged.append((begin, size))
        self.free = merged
