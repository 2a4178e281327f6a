"""`moet-panel telemetry [--once] [--json] [--interval S]`: GPU + host samples, as the panel sees them."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from app.backend.telemetry.gpu import make_gpu_reader
from app.backend.contracts import GpuReader, GpuSample
from app.backend.telemetry.host import HostSample, HostSampler
from app.backend.config import env
from app.cli.main import add_common, settings_from
from app.backend.contracts import GiB


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("telemetry", help="print GPU + host samples (NVML, psutil)")
    add_common(p, json_help="JSON (one object per line when streaming)")
    p.add_argument("--once", action="store_true", help="one sample, then exit")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (default 1)")
    p.add_argument("--gpu", choices=["nvml", "simulated", "none"], help="reader override (env MOET_PANEL_GPU)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    # --gpu, then MOET_PANEL_GPU, then demo mode's SIMULATED GPU (never this box's NVML under --demo)
    reader = make_gpu_reader(settings, mode=args.gpu or env.gpu_mode() or ("simulated" if settings.demo else None))
    host = HostSampler(settings.data_dir)
    host.sample()
    interval = max(args.interval, 0.1)
    try:
        if args.once:
            time.sleep(min(interval, 0.5))  # a second host sample gives disk/net rates
            _emit(reader, host.sample(), args.json, pretty=True)
            return 0 if reader.available else 1
        while True:
            time.sleep(interval)
            _emit(reader, host.sample(), args.json)
    finally:
        reader.close()


def sample_dict(reader: GpuReader, host: HostSample) -> dict:
    gpus = reader.read()
    return {
        "ts": time.time(),
        "gpu": {
            "available": reader.available,
            "error": reader.error,
            "simulated": reader.simulated,
            "gpus": [_gpu_dict(g) for g in gpus],
        },
        "host": {**asdict(host), "ram_used_pct": host.ram_used_pct},
    }


def _gpu_dict(g: GpuSample) -> dict:
    d = asdict(g)
    d.update(memory_total_gib=round(g.memory_total / GiB, 3), memory_used_gib=round(g.memory_used / GiB, 3),
             memory_reserved_gib=round(g.memory_reserved / GiB, 3), memory_in_use_gib=round(g.memory_in_use / GiB, 3))
    return d


def _emit(reader: GpuReader, host: HostSample, as_json: bool, pretty: bool = False) -> None:
    d = sample_dict(reader, host)
    # --once --json: one indented object; streaming --json: JSON Lines (one object per line)
    print(json.dumps(d, indent=2 if pretty else None) if as_json else render_text(d), flush=True)


def render_text(d: dict) -> str:
    out = []
    g = d["gpu"]
    if not g["available"]:
        out.append(f"GPU: {g['error']}")
    for s in g["gpus"]:
        tag = " [SIMULATED]" if s["simulated"] and "SIMULATED" not in s["name"] else ""
        out.append(
            f"GPU {s['index']} {s['name']}{tag}: VRAM {s['memory_in_use_gib']:.1f}/{s['memory_total_gib']:.1f} GiB "
            f"(used {s['memory_used_gib']:.2f} + reserved {s['memory_reserved_gib']:.2f}), util {_n(s['util_gpu'], '%')}, "
            f"power {_n(s['power_w'], ' W')}/{_n(s['power_limit_w'], ' W')}, {_n(s['temperature_c'], ' °C')}, "
            f"SM {_n(s['sm_clock_mhz'], ' MHz')} mem {_n(s['mem_clock_mhz'], ' MHz')}, "
            f"PCIe tx/rx {_n(s['pcie_tx_kbs'], '')}/{_n(s['pcie_rx_kbs'], ' KB/s')}, ECC {_n(s['ecc_current'], '')}, "
            f"throttle {','.join(s['throttle_reasons']) or 'none'}"
        )
        for p in s["processes"]:
            mem = "N/A" if p["used_bytes"] is None else f"{p['used_bytes'] / GiB:.2f} GiB"
            out.append(f"    pid {p['pid']} {p['name'] or '?'} {mem}{' [' + p['container'] + ']' if p['container'] else ''}")
    h = d["host"]
    out.append(
        f"host: CPU {_n(h['cpu_pct'], '%')}, RAM {_n(h['ram_used_pct'], '%')} of {h['ram_total'] / GiB:.1f} GiB, "
        f"swap {h['swap_used'] / GiB:.1f}/{h['swap_total'] / GiB:.1f} GiB, disk free {_gib(h['disk_free'])} "
        f"({h['disk_path']}), disk r/w {_rate(h['disk_read_bps'])}/{_rate(h['disk_write_bps'])}, "
        f"net rx/tx {_rate(h['net_rx_bps'])}/{_rate(h['net_tx_bps'])}"
    )
    return "\n".join(out)


def _n(v, unit: str) -> str:
    if v is None:
        return "N/A"
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:.0f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def _gib(v) -> str:
    return "N/A" if v is None else f"{v / GiB:.1f} GiB"


def _rate(v) -> str:
    return "N/A" if v is None else f"{v / 2**20:.1f} MiB/s"


if __name__ == "__main__":  # `python -m app.cli.telemetry …`: this subcommand alone (fewer imports)
    import sys

    _parser = argparse.ArgumentParser(prog="moet-panel")
    register(_parser.add_subparsers(dest="command"))
    sys.exit(run(_parser.parse_args(["telemetry", *sys.argv[1:]])))
