"""PCIe link generation/width, current and maximum, via NVML (the panel's NVML reader does not read
the link; this is the self-test's one extra read). Errors become '' (unknown), never exceptions."""

from __future__ import annotations

from dataclasses import dataclass

from app.backend import oplog


@dataclass(frozen=True)
class PcieLink:
    gen: int
    width: int
    max_gen: int
    max_width: int

    @property
    def below_max(self) -> bool:
        return self.gen < self.max_gen or self.width < self.max_width

    def text(self) -> str:
        return f"gen{self.gen} x{self.width} (max gen{self.max_gen} x{self.max_width})"


def read_links() -> list[PcieLink]:
    """One entry per GPU; [] without NVML. An idle GPU may train its link down (gen1): read under load."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no NVML here (no GPU, demo mode): no link figures is the answer, nothing went wrong
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append(PcieLink(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                                pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)))
        return out
    except Exception as exc:  # a GPU lost mid-read: no link figures this time
        oplog.caught("selftest", exc, "reading the PCIe links")
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            oplog.caught("selftest", exc, "shutting NVML down after reading the PCIe links")
