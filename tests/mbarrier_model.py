"""An mbarrier as the CPU models of the Hopper kernels' protocols use it (tests/cpu/
test_pair_protocol.py): arrivals and transaction bytes complete a phase; a waiter names the
phase it waits for, as a parity wait does on the GPU."""


class Barrier:
    """An mbarrier: `count` arrivals and the expected bytes (tx) complete a phase."""

    def __init__(self, count, name="barrier"):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx=0):
        assert self.pending > 0, f"{self.name}: arrival on phase {self.phase} with none pending"
        self.pending -= 1
        self.tx += expect_tx
        self._maybe_complete()

    def complete_tx(self, n):
        self.tx -= n  # may go negative before the expecting arrival, as on the GPU
        self._maybe_complete()

    def passed(self, n):
        """Wait for phase n (parity n & 1): passes once phase n completed. A barrier already at
        phase n + 2 has the parity of phase n again: the waiter would take it for phase n in
        progress (it fell two phases behind). n = -1: the phase before the first."""
        assert self.phase <= n + 1, f"{self.name}: a waiter of phase {n} sees phase {self.phase}"
        return self.phase >= n + 1
