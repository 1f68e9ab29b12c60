"""The clocks of the world: one true time, and what each party reads of it.

The host's wall clock can be stepped either way (NTP, an operator); its monotonic and boot
clocks only go forward (a reboot starts the boot clock again under a new boot id); the
provider's clock (its ``Date`` header) has an offset of its own. Nothing reads real time.
"""

from __future__ import annotations

import attrs

from payonce._lifecycle import BootReading

__all__ = ["Clocks"]

START = 1_800_000_000.0
"""The true time a run starts at (a fixed date: nothing depends on when a run happens)."""


@attrs.define
class Clocks:
    true: float = START
    wall_offset: float = 0.0
    provider_offset: float = 0.0
    boot_started: float = START - 1000.0
    boot_id: str = "boot-1"

    def wall(self) -> float:
        return self.true + self.wall_offset

    def monotonic(self) -> float:
        return self.true - START + 10_000.0

    def provider(self) -> float:
        return self.true + self.provider_offset

    def boot(self) -> BootReading:
        return BootReading("simhost@machine-1", self.boot_id, self.true - self.boot_started)

    def reboot(self) -> None:
        """A new boot: its boot clock starts again from 0 under a new boot id."""
        self.boot_id = f"boot-{int(self.boot_id.split('-')[1]) + 1}"
        self.boot_started = self.true

    def advance(self, seconds: float) -> None:
        self.true += max(0.0, seconds)
